// quinebox view: the routes, and the pages of sessions, runs and the audit log (page.js and session.js come first).
"use strict";

// -- routes ----------------------------------------------------------------------------------------

const routes = [
  [/^#?\/?$/, "sessions", showSessions],
  [/^#\/s\/([\w.-]+)(?:\/([\w.-]+))?$/, "session", showSession],
  [/^#\/runs$/, "runs", showRuns],
  [/^#\/r\/([\w.-]+)$/, "run", showRun],
  [/^#\/audit$/, "audit", showAudit],
];

function route() {
  generation += 1;
  refreshers = {};
  document.body.dataset.ready = "0";
  for (const [pattern, name, show] of routes) {
    const match = location.hash.match(pattern);
    if (match) {
      document.body.dataset.route = name;
      document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("here", name.startsWith(a.dataset.nav.slice(0, 3))));
      main.replaceChildren();
      show(...match.slice(1));
      return;
    }
  }
  location.hash = "#/";
}

// Sessions ------------------------------------------------------------------------------------------

function showSessions() {
  const mine = generation;
  const q = h("input", { id: "filter-q", type: "search", placeholder: "mission or id" });
  const state = h("select", { id: "filter-state" }, h("option", { value: "", text: "any state" }),
    ...["running", "waiting", "paused", "done", "failed", "killed", "interrupted"].map((s) => h("option", { value: s, text: s })));
  const exit = h("input", { id: "filter-exit", type: "number", placeholder: "exit", min: "0", max: "255" });
  const since = h("select", { id: "filter-since" }, h("option", { value: "", text: "any time" }),
    ...[["3600", "last hour"], ["86400", "last day"], ["604800", "last week"]].map(([v, t]) => h("option", { value: v, text: t })));
  const body = h("tbody");
  const table = h("table", { id: "sessions" }, h("thead", {}, h("tr", {},
    ...["session", "state", "started", "duration", "turns", "tokens", "exit", "mission"].map((c) => h("th", { text: c })))), body);
  main.append(h("section", { class: "filters" }, q, state, exit, since), table);

  async function load() {
    const params = new URLSearchParams();
    if (q.value.trim()) params.set("q", q.value.trim());
    if (state.value) params.set("state", state.value);
    if (exit.value !== "") params.set("exit", exit.value);
    if (since.value) params.set("since", String(Date.now() / 1000 - Number(since.value)));
    let answer;
    try { answer = await api("/api/sessions?" + params); } catch (err) { return failed(body, err); }
    if (mine !== generation) return;
    let rows = answer.sessions;
    if (DATA) rows = rows.filter((r) => (!state.value || r.state === state.value) && (!q.value || r.mission.toLowerCase().includes(q.value.toLowerCase()) || r.id.startsWith(q.value)));
    body.replaceChildren(...rows.map((r) => h("tr", { class: "session", dataSession: r.id, dataState: r.state, onclick: () => { location.hash = "#/s/" + r.id; } },
      h("td", { class: "mono" }, h("a", { href: "#/s/" + r.id, text: r.id })),
      h("td", {}, badge(r.state)),
      h("td", { text: when(r.started) }),
      h("td", { text: seconds((r.ended || Date.now() / 1000) - r.started) }),
      h("td", { class: "num", text: r.turns }),
      h("td", { class: "num", text: r.tokens }),
      h("td", { class: "num", text: r.exit_code === null ? "" : r.exit_code }),
      h("td", { text: short(r.mission, 100) }),
    )));
    if (!rows.length) body.append(h("tr", {}, h("td", { colspan: "8", class: "empty", text: "no sessions match" })));
    painted();
  }
  for (const input of [q, state, exit, since]) input.addEventListener("input", load);
  refreshers.sessions = load;
  follow(["sessions"]);
  load();
}

// Runs ----------------------------------------------------------------------------------------------

function showRuns() {
  const mine = generation;
  const body = h("tbody");
  main.append(h("h2", { text: "map and batch runs" }), h("table", { id: "runs" }, h("thead", {}, h("tr", {},
    ...["run", "kind", "state", "started", "progress", "mission", "out"].map((c) => h("th", { text: c })))), body));
  async function load() {
    let answer;
    try { answer = await api("/api/runs"); } catch (err) { return failed(body, err); }
    if (mine !== generation) return;
    body.replaceChildren(...answer.runs.map((r) => h("tr", { class: "run", dataRun: r.id, dataState: r.state, onclick: () => { location.hash = "#/r/" + r.id; } },
      h("td", { class: "mono" }, h("a", { href: "#/r/" + r.id, text: r.id })), h("td", { text: r.kind }), h("td", {}, badge(r.state)),
      h("td", { text: when(r.started) }), h("td", { text: `${r.done}/${r.total} done, ${r.failed} failed, ${r.running} running` }),
      h("td", { text: short(r.mission || "", 60) }), h("td", { class: "mono", text: r.out }))));
    if (!answer.runs.length) body.append(h("tr", {}, h("td", { colspan: "7", class: "empty", text: "no map or batch runs yet" })));
    painted();
  }
  refreshers.runs = load;
  follow(["runs"]);
  load();
}

function showRun(id) {
  const mine = generation;
  const progress = h("p", { id: "run-progress" });
  const bar = h("div", { class: "progress" });
  const body = h("tbody");
  main.append(h("section", { id: "run", dataRun: id }, h("h2", {}, "run ", h("span", { class: "mono", text: id })), progress, bar,
    h("table", { id: "run-inputs" }, h("thead", {}, h("tr", {}, ...["input", "state", "exit", "attempts", "duration", "tokens", "session", "output"].map((c) => h("th", { text: c })))), body)));
  async function load() {
    let r;
    try { r = (await api("/api/runs/" + id)).run; } catch (err) { return failed(body, err); }
    if (mine !== generation) return;
    progress.textContent = `${r.done}/${r.total} done, ${r.failed} failed, ${r.running} running`;
    progress.dataset.state = r.state;
    const part = (n, cls) => h("span", { class: cls, style: { width: `${(100 * n / Math.max(1, r.total)).toFixed(2)}%` } });
    bar.replaceChildren(part(r.done - r.failed, "done"), part(r.failed, "failed"), part(r.running, "running"));
    body.replaceChildren(...r.inputs.map((i) => h("tr", { class: "input", dataName: i.name, dataState: i.state },
      h("td", { class: "mono", text: i.name }), h("td", {}, badge(i.state)), h("td", { class: "num", text: i.exit_code === null || i.exit_code === undefined ? "" : i.exit_code }),
      h("td", { class: "num", text: i.attempts || "" }), h("td", { text: seconds(i.duration_s) }), h("td", { class: "num", text: i.tokens || "" }),
      h("td", { class: "mono" }, i.session ? h("a", { href: "#/s/" + i.session, text: i.session }) : ""),
      h("td", {}, i.output ? h("details", {}, h("summary", { text: `${i.output_bytes} B` }), h("pre", { text: i.output })) : ""))));
    painted();
  }
  refreshers[`run:${id}`] = load;
  follow([`run:${id}`]);
  load();
}

// Audit ---------------------------------------------------------------------------------------------

function showAudit() {
  const mine = generation;
  const verdict = h("p", { id: "audit-verify" });
  const waiting = h("div", { id: "approvals" });
  const body = h("tbody");
  main.append(h("h2", { text: "The audit log" }), verdict, h("h3", { text: "Waiting for a person" }), waiting,
    h("h3", { text: "Newest records" }), h("table", { id: "audit-log" }, h("thead", {}, h("tr", {}, ...["seq", "time", "session", "kind", "facts"].map((c) => h("th", { text: c })))), body));
  async function load() {
    let answer, approvals;
    try { [answer, approvals] = await Promise.all([api("/api/audit?limit=300"), api("/api/approvals")]); } catch (err) { return failed(body, err); }
    if (mine !== generation) return;
    verdict.dataset.intact = answer.verify.intact ? "1" : "0";
    verdict.className = answer.verify.intact ? "good" : "bad";
    verdict.textContent = (answer.verify.intact ? "✓ chain " : "✗ chain broken at ") + answer.verify.line;
    waiting.replaceChildren(...approvals.pending.map((p) => pendingRequest(p, approvals.allow_approve)));
    if (!approvals.pending.length) waiting.append(h("p", { class: "hint", text: "nothing is waiting" }));
    body.replaceChildren(...answer.records.slice().reverse().map((r) => h("tr", { class: "record", dataKind: r.kind },
      h("td", { class: "num", text: r.seq }), h("td", { text: new Date(r.time).toLocaleString() }),
      h("td", { class: "mono" }, r.session ? h("a", { href: "#/s/" + r.session, text: r.session }) : ""), h("td", { text: r.kind }),
      h("td", { class: "mono small", text: short(JSON.stringify(r.facts), 240) }))));
    painted();
  }
  refreshers.audit = load;
  refreshers.approvals = load;
  follow(["audit", "approvals"]);
  load();
}

window.addEventListener("hashchange", route);
route();

// quinebox view: one small page, no build step, nothing loaded from anywhere but its own server.
// Every value from a session is put on the page as text (textContent), never as HTML.
"use strict";

const DATA = window.QUINEBOX_DATA || null;            // a static export: answers by API path, no server
const TOKEN = new URLSearchParams(location.search).get("token") || "";
const main = document.getElementById("main");
let stream = null;                                     // the route's EventSource
let refreshers = {};                                   // topic -> function that re-reads it
let generation = 0;                                    // a route change makes older answers stale

// -- small helpers ---------------------------------------------------------------------------------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else if (k === "style") Object.assign(el.style, v);   // through the CSSOM: the page's CSP refuses style attributes
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k.startsWith("data")) el.dataset[k.slice(4, 5).toLowerCase() + k.slice(5)] = v;
    else el.setAttribute(k, v);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

async function api(path) {
  if (DATA) {
    const key = path.split("?")[0];
    if (key in DATA) return DATA[key];
    throw new Error("not in this export: " + key);
  }
  const headers = TOKEN ? { Authorization: "Bearer " + TOKEN } : {};
  const reply = await fetch(path, { headers, credentials: "same-origin" });
  if (!reply.ok) {
    let why = reply.statusText;
    try { why = (await reply.json()).error || why; } catch (e) { /* not JSON */ }
    throw new Error(`${reply.status}: ${why}`);
  }
  return reply.json();
}

const when = (t) => (t ? new Date(t * 1000).toLocaleString() : "");
const clock = (t) => (t ? new Date(t * 1000).toLocaleTimeString() : "");
const seconds = (s) => (s === null || s === undefined ? "" : s < 10 ? s.toFixed(2) + " s" : s < 600 ? s.toFixed(1) + " s" : (s / 60).toFixed(1) + " min");
const short = (text, n) => { const one = String(text || "").split(/\s+/).join(" "); return one.length > n ? one.slice(0, n - 1) + "…" : one; };
const badge = (state) => h("span", { class: "badge " + state, text: state });

function painted() {
  if (document.body.dataset.ready !== "1") {
    window.quineboxPaint = performance.now();
    document.body.dataset.ready = "1";
  }
}

function failed(where, err) {
  where.replaceChildren(h("p", { class: "error", text: String(err.message || err) }));
  painted();
}

// -- live updates ----------------------------------------------------------------------------------

function follow(topics) {
  if (stream) { stream.close(); stream = null; }
  const live = document.getElementById("live");
  if (DATA) { live.textContent = "export (not live)"; return; }
  const query = "topics=" + encodeURIComponent(topics.join(",")) + (TOKEN ? "&token=" + encodeURIComponent(TOKEN) : "");
  stream = new EventSource("/api/events?" + query);
  const pending = new Set();
  let timer = null;
  stream.addEventListener("open", () => { live.textContent = "live"; live.className = "on"; });
  stream.addEventListener("error", () => { live.textContent = "reconnecting"; live.className = "off"; });
  stream.addEventListener("change", (event) => {
    pending.add(JSON.parse(event.data).topic);
    if (timer) return;
    timer = setTimeout(() => {
      timer = null;
      const topics = [...pending];
      pending.clear();
      for (const topic of topics) if (refreshers[topic]) refreshers[topic]();
    }, 120);
  });
}

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
    ...["running", "waiting", "done", "failed", "killed"].map((s) => h("option", { value: s, text: s })));
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
      h("td", { text: short(r.mission, 100) + (r.parent ? "" : "") }),
    )));
    if (!rows.length) body.append(h("tr", {}, h("td", { colspan: "8", class: "empty", text: "no sessions match" })));
    painted();
  }
  for (const input of [q, state, exit, since]) input.addEventListener("input", load);
  refreshers.sessions = load;
  follow(["sessions"]);
  load();
}

// One session: its tree, the selected node's transcript, timeline and world ----------------------------

function showSession(root, selected) {
  const mine = generation;
  selected = selected || root;
  const tree = h("div", { id: "tree" });
  const summary = h("div", { id: "node-summary" });
  const here = h("div", { id: "approvals-here" });
  const timeline = h("div", { id: "timeline" });
  const transcript = h("div", { id: "transcript", dataSession: selected });
  const world = h("div", { id: "world" });
  const tabs = h("div", { class: "tabs" },
    h("button", { class: "tab on", text: "Transcript", onclick: (e) => tab(e, transcript) }),
    h("button", { class: "tab", id: "world-tab", text: "World", onclick: (e) => { tab(e, world); loadWorld(); } }));
  world.hidden = true;
  main.append(h("div", { class: "split" },
    h("section", { class: "left" }, h("h2", { text: "Process tree" }), h("p", { class: "hint", text: "★ marks the critical path: the chain of children that ended last." }), tree),
    h("section", { class: "right" }, summary, here, timeline, tabs, transcript, world)));
  let nodes = {};
  let next = 0;
  let records = [];

  function tab(event, shown) {
    document.querySelectorAll(".tab").forEach((b) => b.classList.toggle("on", b === event.target));
    transcript.hidden = shown !== transcript;
    world.hidden = shown !== world;
  }

  async function loadTree() {
    let answer;
    try { answer = await api(`/api/sessions/${root}/tree`); } catch (err) { return failed(tree, err); }
    if (mine !== generation) return;
    nodes = Object.fromEntries(answer.nodes.map((n) => [n.id, n]));
    const kids = {};
    for (const n of answer.nodes) (kids[n.parent] = kids[n.parent] || []).push(n);
    const draw = (n) => h("li", {},
      h("div", { class: "node" + (n.id === selected ? " selected" : ""), dataSession: n.id, dataParent: n.parent || "", dataState: n.state, dataCritical: n.critical ? "1" : "0", dataKind: n.kind },
        h("span", { class: "label", onclick: () => select(n.id) },
          badge(n.state), n.critical ? h("span", { class: "crit", title: "on the critical path", text: "★" }) : null,
          h("span", { class: "mono", text: n.id }), " ", h("span", { text: short(n.mission, 60) })),
        h("span", { class: "facts", text: [n.how, seconds(n.duration_s), n.kind === "agent" ? `${n.turns} turns · ${n.tokens} tokens` : "command",
          n.exit_code === null ? "" : "exit " + n.exit_code + (n.termination ? ` (${n.termination})` : "")].filter(Boolean).join(" · ") })),
      (kids[n.id] || []).length ? h("ul", {}, ...kids[n.id].map(draw)) : null);
    const top = answer.nodes.find((n) => n.id === answer.root);
    tree.replaceChildren(h("p", { class: "hint", text: `${answer.nodes.length} boxes` }), h("ul", { class: "tree" }, draw(top)));
    drawSummary();
    painted();
  }

  function drawSummary() {
    const n = nodes[selected];
    if (!n) { summary.replaceChildren(h("p", { class: "hint", text: "not in this tree" })); return; }
    summary.dataset.state = n.state;
    summary.replaceChildren(
      h("h2", {}, badge(n.state), " ", h("span", { class: "mono", text: n.id })),
      h("p", { class: "mission", text: n.mission }),
      h("dl", {},
        ...[["parent", n.parent || "—"], ["spawned by", n.how || "—"], ["model", n.model || "—"], ["started", when(n.started)],
          ["duration", seconds(n.duration_s)], ["turns", n.turns], ["tokens", n.tokens],
          ["exit", n.exit_code === null ? "—" : `${n.exit_code} (${n.termination || ""})`], ["grants", (n.grants || []).join(" ") || "none"]]
          .flatMap(([k, v]) => [h("dt", { text: k }), h("dd", { text: v })])));
  }

  function select(id) {
    history.replaceState(null, "", `${location.search}#/s/${root}/${id}`);
    delete refreshers[`session:${selected}`];
    refreshers[`session:${id}`] = loadTranscript;
    selected = id;
    document.querySelectorAll("#tree .node").forEach((el) => el.classList.toggle("selected", el.dataset.session === id));
    transcript.dataset.session = id;
    transcript.replaceChildren();
    world.replaceChildren();
    next = 0;
    records = [];
    drawSummary();
    loadTranscript();
    if (!world.hidden) loadWorld();
    follow(topics());
  }

  async function loadTranscript() {
    const id = selected;
    if (nodes[id] && nodes[id].kind === "exec") {
      transcript.replaceChildren(h("p", { class: "hint", text: "a command's box: it keeps no transcript (its parent's tape shows the command)" }));
      timeline.replaceChildren();
      return;
    }
    let answer;
    try { answer = await api(`/api/sessions/${id}/transcript?after=${next}`); } catch (err) { return failed(transcript, err); }
    if (mine !== generation || id !== selected || answer.entries.length === 0 && next > 0) return;
    next = answer.next;
    records.push(...answer.entries);
    transcript.append(...answer.entries.map(entry));
    drawTimeline();
  }

  function drawTimeline() {
    if (!records.length) return;
    const t0 = records[0].t;
    const t1 = Math.max(records[records.length - 1].t, t0 + 0.001);
    const marks = records.filter((r) => ["response", "exec", "restore_world", "revision", "spawn", "outcome", "tool_error", "provider_error"].includes(r.kind));
    timeline.replaceChildren(h("div", { class: "bar" }, ...marks.map((r) => h("span", {
      class: "mark " + r.kind, title: `${r.kind}${r.turn ? " turn " + r.turn : ""} at ${clock(r.t)}`,
      style: { left: `${(100 * (r.t - t0) / (t1 - t0)).toFixed(2)}%` }, onclick: () => { const el = transcript.querySelector(`[data-i="${r.i}"]`); if (el) el.scrollIntoView(); },
    }))), h("div", { class: "legend", text: `${seconds(t1 - t0)} · turns ▮ · exec renewals ◆ · world restores ↺ · revisions · children` }));
  }

  async function loadWorld() {
    const id = selected;
    let answer;
    try { answer = await api(`/api/sessions/${id}/world`); } catch (err) { return world.replaceChildren(h("p", { class: "hint", text: "no world revisions: " + err.message })); }
    if (mine !== generation || id !== selected) return;
    const diff = h("pre", { id: "world-diff" });
    const files = h("div", { id: "world-files" });
    world.replaceChildren(h("table", { class: "revs" }, h("tbody", {}, ...answer.revisions.map((r) => h("tr", { class: "rev", dataRev: r.rev, onclick: () => showRev(id, r.rev, diff, files) },
      h("td", { class: "num", text: "rev " + r.rev }), h("td", { text: r.turn === null || r.turn === undefined ? "" : "turn " + r.turn }), h("td", { text: clock(r.t) }),
      h("td", { class: "num", text: `${r.files || 0} paths, ${r.bytes || 0} B` }), h("td", { class: "mono", text: short(r.command || r.what || "", 90) }))))), diff, files);
  }

  async function showRev(id, rev, diff, files) {
    document.querySelectorAll("#world .rev").forEach((el) => el.classList.toggle("selected", el.dataset.rev === String(rev)));
    try {
      const answer = await api(`/api/sessions/${id}/world/${rev}/diff`);
      diff.textContent = answer.diff || "(no changes)";
    } catch (err) { diff.textContent = err.message; }
    if (DATA) return;
    try {
      const listing = await api(`/api/sessions/${id}/world/${rev}/files`);
      const shown = h("pre", { class: "file" });
      files.replaceChildren(h("h3", { text: `files at rev ${rev}` }), h("ul", {}, ...listing.files.filter((f) => f.type !== "d").map((f) => h("li", {},
        h("a", { href: "javascript:void 0", class: "mono", text: `${f.path} (${f.size} B)`, onclick: async () => {
          try { const one = await api(`/api/sessions/${id}/world/${rev}/file?path=${encodeURIComponent(f.path)}`); shown.textContent = one.text === null ? (one.binary ? "(binary)" : "(not shown: large, or not kept)") : one.text; }
          catch (err) { shown.textContent = err.message; }
        } })))), shown);
    } catch (err) { files.replaceChildren(); }
  }

  async function loadApprovals() {
    let answer;
    try { answer = await api("/api/approvals"); } catch (err) { return; }
    if (mine !== generation) return;
    const ids = new Set(Object.keys(nodes));
    here.replaceChildren(...answer.pending.filter((p) => ids.has(p.session)).map((p) => pendingRequest(p, answer.allow_approve)));
  }

  function topics() { return [`tree:${root}`, `session:${selected}`, "approvals"]; }
  refreshers[`tree:${root}`] = () => { loadTree(); loadApprovals(); };
  refreshers.approvals = () => { loadApprovals(); loadTree(); };
  refreshers[`session:${selected}`] = loadTranscript;
  follow(topics());
  loadTree().then(loadApprovals);
  loadTranscript();
}

function entry(r) {
  const head = h("div", { class: "head" }, h("span", { class: "kind", text: r.kind }), r.turn ? h("span", { text: "turn " + r.turn }) : null, h("span", { class: "time", text: clock(r.t) }));
  const body = [];
  const pre = (text, cls) => h("pre", { class: cls || "", text: String(text) });
  switch (r.kind) {
    case "meta":
      body.push(h("p", { class: "mission", text: r.mission }), h("p", { class: "hint", text: `model ${r.model} · image ${r.image || ""} · grants ${(r.grants || []).join(" ") || "none"}` }));
      if (r.forked_from) body.push(h("p", { class: "hint", text: `forked from ${r.forked_from.session} at turn ${r.forked_from.turn}` }));
      break;
    case "request":
      body.push(h("details", {}, h("summary", { text: `${(r.messages || []).length} new message(s) to the model` }),
        ...(r.messages || []).map((m) => h("div", { class: "msg " + m.role }, h("b", { text: m.role }), pre(m.content === null ? "" : m.content)))));
      break;
    case "response": {
      const m = r.message || {};
      if (m.content) body.push(pre(m.content, "say"));
      for (const call of m.tool_calls || []) {
        let args = call.function && call.function.arguments;
        try { args = JSON.stringify(JSON.parse(args), null, 1); } catch (e) { /* as given */ }
        body.push(h("div", { class: "call" }, h("b", { text: (call.function || {}).name + "(…)" }), pre(args)));
      }
      body.push(h("p", { class: "hint", text: `${(r.usage || {}).total_tokens || 0} tokens · ${r.finish_reason || ""} · ${seconds(r.latency_s)}` }));
      break;
    }
    case "tool":
      body.push(h("p", {}, h("b", { text: r.name }), " ", h("span", { class: "mono", text: r.args ? JSON.stringify(r.args) : "" }), " → ", h("b", { text: "exit " + r.exit_code })), pre(r.result || "", "result"));
      break;
    case "tool_error": case "provider_error": case "world_error":
      body.push(pre(r.error || r.message || "", "bad"));
      break;
    case "exec":
      body.push(h("p", { text: `exec: a fresh conversation, cycle ${r.cycle}` + (r.note ? ` — ${r.note}` : "") }));
      break;
    case "revision":
      body.push(h("p", { text: `world revision ${r.rev}: ${r.files} path(s), ${r.bytes} bytes` + (r.command ? ` after ${short(r.command, 80)}` : "") }));
      break;
    case "restore_world":
      body.push(h("p", { text: `world restored to revision ${r.revision}` }));
      break;
    case "spawn":
      body.push(h("p", {}, `started a child (${r.what}): `, h("span", { class: "mono", text: r.child }), ` with ${(r.grants || []).join(" ") || "no grants"}`));
      break;
    case "egress":
      body.push(h("p", { text: r.allowed ? `${r.host}:${r.port} allowed by ${r.rule} (${r.up || 0} B up, ${r.down || 0} B down)` : `refused ${r.host || ""}:${r.port || ""}: ${r.why}` }));
      break;
    case "outcome":
      body.push(h("p", { class: r.exit_code === 0 ? "good" : "bad", text: `exit ${r.exit_code} (${r.termination}) · ${r.turns} turns · ${r.tokens} tokens · ${seconds(r.duration_s)}` }));
      break;
    default: {
      const rest = Object.fromEntries(Object.entries(r).filter(([k]) => !["i", "t", "kind", "turn"].includes(k)));
      body.push(pre(JSON.stringify(rest, null, 1)));
    }
  }
  return h("div", { class: "entry " + r.kind, dataKind: r.kind, dataI: r.i }, head, ...body);
}

function pendingRequest(p, allowed) {
  const decide = async (allow, scope) => {
    const reply = await fetch(`/api/approvals/${p.id}`, { method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-Quinebox-Token": TOKEN }, body: JSON.stringify({ allow, scope }) });
    const note = document.querySelector(`.pending[data-request="${p.id}"] .outcome`);
    if (note) note.textContent = reply.ok ? (allow ? "approved" : "denied") : `refused: ${reply.status}`;
  };
  return h("div", { class: "pending", dataRequest: p.id, dataSession: p.session },
    h("p", {}, h("b", { text: "waiting for a person: " }), h("span", { text: p.subject })),
    h("p", { class: "hint", text: `${p.kind} · session ${p.session} · since ${p.since}` }),
    allowed ? h("span", {},
      h("button", { class: "approve", onclick: () => decide(true, "once"), text: "Approve once" }),
      h("button", { class: "approve-session", onclick: () => decide(true, "session"), text: "for the session" }),
      h("button", { class: "deny", onclick: () => decide(false, "once"), text: "Deny" })) : h("span", { class: "hint", text: "read-only view: `quinebox approve " + p.id + "`" }),
    h("span", { class: "outcome" }));
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

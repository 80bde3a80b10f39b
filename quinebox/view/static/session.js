// quinebox view: one session's page — its process tree, the selected agent's transcript and timeline, its world.
"use strict";

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
    if (answer.root !== root) { location.replace(`${location.search}#/s/${answer.root}`); return; }  // a prefix: the whole id
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
    summary.replaceChildren(...[
      h("h2", {}, badge(n.state), " ", h("span", { class: "mono", text: n.id })),
      h("p", { class: "mission", text: n.mission }),
      h("dl", {},
        ...[["parent", n.parent || "—"], ["spawned by", n.how || "—"], ["model", n.model || "—"], ["started", when(n.started)],
          ["duration", seconds(n.duration_s)], ["turns", n.turns], ["tokens", n.tokens],
          ["exit", n.exit_code === null ? "—" : `${n.exit_code} (${n.termination || ""})`], ["grants", (n.grants || []).join(" ") || "none"]]
          .flatMap(([k, v]) => [h("dt", { text: k }), h("dd", { text: v })])),
      n.state === "interrupted" ? h("p", { class: "hint resume", text: `its process was lost: \`quinebox resume ${n.id}\` goes on from its last complete turn` }) : null,
      (n.moments || []).length ? h("ul", { class: "moments" }, ...n.moments.map((m) => h("li", { dataWhat: m.what, text: `${clock(m.t)} ${moment(m)}` }))) : null,
    ].filter(Boolean));
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

  let reading = null;   // one read of the transcript at a time; a change meanwhile reads once more after it
  let again = false;
  async function loadTranscript() {
    if (reading) { again = true; return reading; }
    reading = readTranscript();
    try { await reading; } finally { reading = null; }
    if (again) { again = false; return loadTranscript(); }
  }

  async function readTranscript() {
    const id = selected;
    if (nodes[id] && nodes[id].kind === "exec") {
      transcript.replaceChildren(h("p", { class: "hint", text: "a command's box: it keeps no transcript (its parent's tape shows the command)" }));
      timeline.replaceChildren();
      return;
    }
    let answer;
    try { answer = await api(`/api/sessions/${id}/transcript?after=${next}`); } catch (err) { return failed(transcript, err); }
    if (mine !== generation || id !== selected || answer.entries.length === 0 && next > 0) return;
    const fresh = answer.entries.filter((r) => r.i >= next);
    next = answer.next;
    records.push(...fresh);
    transcript.append(...fresh.map(entry));
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
    diff.dataset.rev = String(rev);
    if (DATA) return;
    try {
      const listing = await api(`/api/sessions/${id}/world/${rev}/files`);
      const shown = h("pre", { class: "file" });
      files.replaceChildren(h("h3", { text: `files at rev ${rev}` }), h("ul", {}, ...listing.files.filter((f) => f.type !== "d").map((f) => h("li", {},
        h("button", { class: "link mono", text: `${f.path} (${f.size} B)`, onclick: async () => {
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

// A moment a box's time was revised (the audit log's pause, resume, snapshot, restore), in words.
function moment(m) {
  if (m.what === "resumed" && m.paused_s !== undefined) return `resumed after ${seconds(m.paused_s)} paused`;
  if (m.what === "snapshot") return `snapshot ${m.snapshot || "?"}` + (m.bytes ? ` (${(m.bytes / 1048576).toFixed(1)} MiB)` : "") + (m.transient ? ", for a fork" : "");
  if (m.what === "restored") return `restored from snapshot ${m.snapshot || "?"} of box ${m.box || "?"}`;
  if (m.what === "resumed after its host died" && m.turn !== undefined) return `${m.what}, from turn ${m.turn}`;
  return m.what;
}

// A tape is written from a box's requests, so a record may have any shape: one that cannot be drawn is shown as JSON.
function entry(r) {
  try { return drawEntry(r); } catch (err) {
    return h("div", { class: "entry odd", dataKind: String(r.kind), dataI: r.i }, h("pre", { text: JSON.stringify(r, null, 1) }));
  }
}

function drawEntry(r) {
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

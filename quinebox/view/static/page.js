// quinebox view: one small page in three scripts, no build step, nothing loaded from anywhere but its own server.
// This one holds what every view shares. Every value from a session goes on the page as text (textContent), never as HTML.
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
  // The server says "ready" once it has noted where things stand; whatever changed before that, read it again now.
  stream.addEventListener("ready", () => { for (const refresh of new Set(Object.values(refreshers))) refresh(); });
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

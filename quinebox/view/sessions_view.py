"""Sessions as the view shows them: their states, a session's process tree, and one agent's transcript.

Everything here is read from the sessions index, the tapes and the audit log (through `AuditTail`); the
functions that decide what a record means (`state_of`, `how_spawned`, `critical_path`) are pure, so the
page's meaning is tested without a server.
"""

from __future__ import annotations

import builtins
import re
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from quinebox.agent.store import Index, SessionRow, read_tape
from quinebox.agent.tapes import not_found
from quinebox.agent.tool_calls import ToolCalls
from quinebox.audit.boxes import BoxLife
from quinebox.processes import owner_alive
from quinebox.state import session_dir
from quinebox.view.audit_view import AuditTail

#: Terminations that mean the box was stopped from outside, not that the agent failed.
KILLED = {"killed", "timeout", "oom", "time", "world_full", "engine_lost"}
#: What a session id looks like (box/spec.py makes them); anything else names no tape.
SESSION_ID = re.compile(r"[0-9a-f]{6,64}")
#: Longest string of a transcript entry sent to the page; the rest is named, not sent.
MAX_TEXT = 32 << 10


def state_of(ended: float | None, exit_code: int | None, termination: str | None, *, alive: bool, waiting: bool, paused: bool = False,
             interrupted: bool = False) -> str:
    """One word for a box: running (or waiting for a person, or paused), done, failed, killed (from outside, or its
    owner died), or interrupted (an agent whose owner died, which `quinebox resume` goes on with)."""
    if ended is None:
        if not alive:
            return "interrupted" if interrupted else "killed"
        return "paused" if paused else "waiting" if waiting else "running"
    if exit_code == 0:
        return "done"
    if (termination or "") in KILLED or (exit_code is not None and exit_code >= 128):
        return "killed"
    return "failed"


def how_spawned(tape: list[dict[str, Any]], child: str) -> str | None:
    """How the parent whose tape this is (as `read_tape` gives it) started `child`: fork:wait|race|forget, quinebox run|exec, or a pipeline.

    A spawn happens while one of the tool calls of the last response runs (`ToolCalls` says which)."""
    calls = ToolCalls()
    for record in tape:
        call = calls.step(record)
        if record.get("kind") == "spawn" and record.get("child") == child:
            what = "quinebox exec" if record.get("what") == "exec" else "quinebox run"
            if call is None:
                return what
            arguments = call.parsed()
            if call.name == "fork":
                mode = arguments.get("mode")
                return f"fork:{mode}" if mode in ("wait", "race", "forget") else "fork"
            command = str(arguments.get("command") or "")
            if "|" in command and command.count("quinebox") > 1:
                return "pipeline"
            return what
    return None


def _owner_alive(box: BoxLife | None) -> bool:
    """Whether the process that started a box still runs; a box the log does not name, or names no owner of, is taken to."""
    return box is None or box.owner is None or owner_alive(box.owner)


def critical_path(nodes: list[dict[str, Any]], root: str, now: float) -> list[str]:
    """Root to leaf, each step to the child that ended last: the chain that set when the tree was done."""
    children: dict[str | None, list[dict[str, Any]]] = {}
    for node in nodes:
        children.setdefault(node["parent"], []).append(node)
    path, current = [root], root
    while children.get(current):
        last = max(children[current], key=lambda n: n["ended"] if n["ended"] is not None else now)
        path.append(last["id"])
        current = last["id"]
    return path


def so_far(tape: list[dict[str, Any]]) -> dict[str, int]:
    """Turns and tokens of a session still running, from its tape."""
    answers = [r for r in tape if r.get("kind") == "response"]
    tokens = sum(int((r.get("usage") or {}).get("total_tokens") or 0) for r in answers)
    return {"turns": len(answers), "tokens": tokens}


def clip(value: Any) -> Any:
    """Strings past MAX_TEXT cut, saying how long they were (scrub secrets first: a cut could keep half of one)."""
    if isinstance(value, str) and len(value) > MAX_TEXT:
        return value[:MAX_TEXT] + f"\n[cut for the page: {len(value)} characters in all; `quinebox logs` has it whole]"
    if isinstance(value, dict):
        return {k: clip(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clip(v) for v in value]
    return value


class Sessions:
    """The sessions index and the tapes, with the audit log's boxes beside them."""

    def __init__(self, audit: AuditTail, waiting: Callable[[], set[str]], scrub: Callable[[Any], Any]):
        self.index = Index()
        self.audit = audit
        self._waiting = waiting
        self._scrub = scrub

    def _alive(self, session: str) -> bool:
        return _owner_alive(self.audit.box(session))

    def row(self, row: SessionRow, waiting: set[str] | None = None, interrupted: set[str] | None = None) -> dict[str, Any]:
        waiting = self._waiting() if waiting is None else waiting
        interrupted = self.index.interrupted([row]) if interrupted is None else interrupted
        box = self.audit.box(row.id)
        alive = row.ended is not None or _owner_alive(box)
        state = state_of(row.ended, row.exit_code, row.termination, alive=alive, waiting=row.id in waiting, paused=box is not None and box.paused,
                         interrupted=row.id in interrupted)
        return {**asdict(row), "state": state}

    def list(self, *, q: str = "", state: str = "", since: float | None = None, exit_code: int | None = None, limit: int = 200) -> builtins.list[dict[str, Any]]:
        self.audit.refresh()
        waiting = self._waiting()
        found = self.index.recent(max(limit * 4, 1000) if (q or state or exit_code is not None) else limit)
        interrupted = self.index.interrupted(found)
        rows = [self.row(r, waiting, interrupted) for r in found]
        words = q.lower().split()
        return [
            r for r in rows
            if all(w in r["mission"].lower() or r["id"].startswith(w) for w in words)
            and (not state or r["state"] == state)
            and (since is None or r["started"] >= since)
            and (exit_code is None or r["exit_code"] == exit_code)
        ][:limit]

    def find(self, session: str) -> SessionRow:
        row = self.index.get(session)
        if row is None and self.index.pruned(session) is not None:
            raise not_found(self.index, session)  # 404, saying it was pruned and when
        if row is None:
            raise KeyError(session)
        return row

    def one(self, session: str) -> dict[str, Any]:
        row = self.find(session)
        tape = read_tape(row.id)
        meta = tape[0] if tape and tape[0].get("kind") == "meta" else {}
        keep = ("grants", "image", "workdir", "depth", "forked_from")
        return {"session": self.row(row), "meta": {k: meta[k] for k in keep if k in meta}, "moments": self._moments(row.id)}

    def _moments(self, session: str) -> builtins.list[dict[str, Any]]:
        """The box's time revised, as the audit log has it: paused, resumed, snapshots, restored from one."""
        box = self.audit.box(session)
        return list(box.moments) if box is not None else []

    def tree(self, session: str) -> dict[str, Any]:
        """Every box below `session`: agents from the index, other boxes (in-box `quinebox exec`) from the audit log.
        `session` may be a box that is no agent (a long-lived box, `quinebox exec`): the log has it, and its children."""
        self.audit.refresh()
        waiting = self._waiting()
        tapes: dict[str, list[dict[str, Any]]] = {}
        now = time.time()
        interrupted: set[str] | None  # of the agents below, or None: each row asks for itself
        try:
            row = self.find(session)
        except KeyError:  # no agent, nor a pruned one: a box the audit log knows, or nothing
            box = self.audit.box(session)
            if box is None or box.created is None:
                raise
            interrupted = None
            nodes = [self._exec_node(box, tapes, now)]
        else:
            interrupted = self.index.interrupted(self.index.subtree(row.id))
            nodes = [{**self._node(self.row(row, waiting, interrupted), tapes, now), "kind": "agent"}]
        known, pending = {nodes[0]["id"]}, [nodes[0]["id"]]
        while pending:  # breadth first; a command's box may start agents too, so both kinds are walked
            parent = pending.pop(0)
            for row in self.index.children(parent):
                if row.id not in known:
                    known.add(row.id)
                    pending.append(row.id)
                    nodes.append({**self._node(self.row(row, waiting, interrupted), tapes, now), "kind": "agent"})
            for box in self.audit.children(parent):
                if box.session not in known and not box.agent:
                    known.add(box.session)
                    pending.append(box.session)
                    nodes.append(self._exec_node(box, tapes, now))
        root = nodes[0]["id"]
        path = critical_path(nodes, root, now)
        for node in nodes:
            node["critical"] = node["id"] in path
        return {"root": root, "nodes": nodes, "critical_path": path}

    def _node(self, row: dict[str, Any], tapes: dict[str, builtins.list[dict[str, Any]]], now: float) -> dict[str, Any]:
        tape = self._tape(row["id"], tapes)
        meta = (tape or [{}])[0]
        parent = row["parent"]
        if row["ended"] is None:  # the index counts turns and tokens when a session ends; until then its tape does
            row = {**row, **so_far(tape)}
        return {
            "id": row["id"], "parent": parent, "mission": row["mission"], "state": row["state"], "exit_code": row["exit_code"],
            "termination": row["termination"], "turns": row["turns"], "tokens": row["tokens"], "started": row["started"],
            "ended": row["ended"], "duration_s": round((row["ended"] or now) - row["started"], 3), "model": row["model"],
            "grants": meta.get("grants") if isinstance(meta.get("grants"), list) else [],
            "how": how_spawned(self._tape(parent, tapes), row["id"]) if parent else None, "moments": self._moments(row["id"]),
        }

    def _exec_node(self, box: BoxLife, tapes: dict[str, builtins.list[dict[str, Any]]], now: float) -> dict[str, Any]:
        alive = box.ended is not None or _owner_alive(box)
        started = box.created or now
        return {
            "id": box.session, "parent": box.parent, "mission": "(a command)", "kind": "exec",
            "state": state_of(box.ended, box.exit_code, box.termination, alive=alive, waiting=False, paused=box.paused),
            "exit_code": box.exit_code, "termination": box.termination, "turns": 0, "tokens": 0, "started": started,
            "ended": box.ended, "duration_s": round((box.ended or now) - started, 3), "model": None, "grants": box.grants,
            "how": how_spawned(self._tape(box.parent, tapes), box.session) if box.parent else None, "moments": list(box.moments),
        }

    @staticmethod
    def _tape(session: str | None, tapes: dict[str, builtins.list[dict[str, Any]]]) -> builtins.list[dict[str, Any]]:
        if session is None:
            return []
        if session not in tapes:
            try:
                tapes[session] = read_tape(session)
            except OSError:
                tapes[session] = []
        return tapes[session]

    def transcript(self, session: str, after: int = 0) -> dict[str, Any]:
        """The tape's records from `after` on, each numbered, so a page following a running agent asks only for what is new."""
        row = self.find(session)
        tape = read_tape(row.id)
        entries = [{**clip(self._scrub(record)), "i": i} for i, record in enumerate(tape) if i >= after]
        return {"session": row.id, "entries": entries, "next": len(tape), "done": any(r.get("kind") == "outcome" for r in tape[-1:])}

    def stamp(self, session: str | None = None) -> Any:
        """A value that changes when the sessions (or one session's tape) change: cheap enough to poll.

        The index changes when a session starts or ends; a running one also changes as its tape grows (its turns,
        tokens, duration) and when its owner dies (it is killed, though nothing will ever end it in the index)."""
        if session is None:
            return self.index.version(), tuple((r.id, self._tape_size(r.id), self._alive(r.id)) for r in self.index.running())
        return self._tape_size(session)

    @staticmethod
    def _tape_size(session: str) -> int | None:
        if not SESSION_ID.fullmatch(session):
            return None
        try:
            return (session_dir(session) / "tape.jsonl").stat().st_size
        except OSError:
            return None

    def close(self) -> None:
        self.index.close()

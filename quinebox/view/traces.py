"""A finished tree as OpenTelemetry spans, built from what quinebox already records: records in, span descriptions out.

Spans are made after the tree ends, from the sessions index, each session's tape and the audit log, with the
times those recorded. Nothing on a box's path waits on a collector, a run costs nothing when tracing is off,
and `quinebox trace` exports any recorded session later exactly as a live run would have.

    box                  one per box (the audit log's box_created .. box_ended), agent or command
      invoke_agent quinebox      the agent's session (tape meta .. outcome)
        turn N                   one model turn: its request .. the last thing it led to
          chat MODEL             the model call (its latency, usage, finish reason)
          execute_tool NAME      each tool call the answer made, in order
            box                  a child started while that tool ran (a fork, an in-box `quinebox`)

Names and attributes follow the OpenTelemetry GenAI semantic conventions. Content stays out: no message, tool
argument or tool result is put in a span (the conventions make content opt-in), and no environment value ever
reaches the records this reads. Everything here is pure and takes records as found: a field of the wrong
type is left out, never a crash, since a tape is written by a box's requests.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from quinebox.agent.store import SessionRow
from quinebox.agent.tool_calls import ANSWERS, Call, ToolCalls
from quinebox.audit.boxes import BoxLife, box_lives

AttributeValue = str | bool | int | float | Sequence[str]
#: The longest mission kept in a span: enough to know which run it was, not a transcript.
MISSION_CHARS = 256
#: Longest other text (a model name, a status description).
TEXT_CHARS = 200
AGENT_NAME = "quinebox"


@dataclass
class Span:
    """One span to replay: `parent` is an index into the same list (None: a root)."""

    name: str
    start_ns: int
    end_ns: int
    parent: int | None
    attributes: dict[str, AttributeValue] = field(default_factory=dict)
    #: "client" for a call to a model (another service), else "internal".
    kind: str = "internal"
    #: When set, the span's status is ERROR with this description.
    error: str | None = None


@dataclass(frozen=True)
class Run:
    """A `map` or `batch` run: one span above each input's tree, so the whole run is one trace."""

    kind: str
    started: float
    ended: float
    exit_code: int
    #: Each input's landed session, and the input's name.
    inputs: Mapping[str, str]


#: Latest time a span may carry (about the year 2096): a box can write any number into its events, and a span's
#: time in nanoseconds must stay an integer the SDK and OTLP take.
LATEST_S = 4e9


def ns(seconds: float) -> int:
    return int(round(min(max(seconds, 0.0), LATEST_S) * 1e9))


def _num(value: Any) -> float | None:
    """A finite number, or None: an int or float a tape or the audit log holds, nothing else (bool, NaN, inf, text)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value: Any, limit: int = TEXT_CHARS) -> str | None:
    if not isinstance(value, str):
        return None
    return value if len(value) <= limit else value[: limit - 1] + "…"


def provider_of(model: str) -> str:
    """gen_ai.provider.name: quinebox's own offline providers, or the OpenAI-compatible endpoint every other model is at."""
    for prefix in ("script", "replay"):
        if model.startswith(prefix + ":"):
            return f"quinebox.{prefix}"
    return "openai"


def clean_tape(tape: Iterable[Any]) -> list[dict[str, Any]]:
    """The records that have a kind and a time; anything else on a tape is no event of ours."""
    return [r for r in tape if isinstance(r, dict) and isinstance(r.get("kind"), str) and _num(r.get("t")) is not None]


def build(roots: Sequence[str], rows: Mapping[str, SessionRow], tapes: Mapping[str, Sequence[Any]], audit: Iterable[Any], run: Run | None = None) -> list[Span]:
    """The spans of the trees under `roots`: each session the index or the audit log says is below one, once."""
    builder = _Builder(rows, {s: clean_tape(t) for s, t in tapes.items()}, box_lives(audit))
    top = None
    if run is not None:
        top = builder.add(run.kind, run.started, run.ended, None, {"quinebox.run.kind": run.kind, "quinebox.run.inputs": len(run.inputs), "quinebox.exit_code": run.exit_code})
        if run.exit_code:
            builder.spans[top].error = f"exit {run.exit_code}"
    for root in roots:
        builder.session(root, top, {"quinebox.input": run.inputs[root]} if run is not None and root in run.inputs else {})
    return builder.spans


class _Builder:
    def __init__(self, rows: Mapping[str, SessionRow], tapes: Mapping[str, list[dict[str, Any]]], boxes: Mapping[str, BoxLife]):
        self.rows = rows
        self.tapes = tapes
        self.boxes = boxes
        self.spans: list[Span] = []
        self.done: set[str] = set()
        self.children: dict[str, list[str]] = {}
        for session, parent in [*((r.id, r.parent) for r in rows.values()), *((s, b.parent) for s, b in boxes.items())]:
            if isinstance(parent, str) and session not in self.children.get(parent, []):
                self.children.setdefault(parent, []).append(session)

    def add(self, name: str, start: float, end: float, parent: int | None, attributes: Mapping[str, Any], kind: str = "internal") -> int:
        kept = {k: v for k, v in attributes.items() if v is not None}
        self.spans.append(Span(name, ns(start), max(ns(start), ns(end)), parent, kept, kind))
        return len(self.spans) - 1

    def stretch(self, index: int, until: float) -> None:
        span = self.spans[index]
        span.end_ns = max(span.end_ns, ns(until))

    def session(self, session: str, parent: int | None, extra: Mapping[str, Any]) -> None:
        """A box and what ran in it, then each child under the span that started it."""
        if session in self.done:
            return
        self.done.add(session)
        row, box, tape = self.rows.get(session), self.boxes.get(session), self.tapes.get(session, [])
        if row is None and box is None and not tape:
            return
        meta = next((r for r in tape if r["kind"] == "meta"), {})
        outcome = next((r for r in reversed(tape) if r["kind"] == "outcome"), None)
        times = [float(r["t"]) for r in tape]
        start = _num(meta.get("t")) or (row.started if row and _num(row.started) else None) or (box.created if box else None) or (min(times) if times else 0.0)
        end = (_num(outcome.get("t")) if outcome else None) or (_num(row.ended) if row else None) or (box.ended if box else None) or max([start, *times])
        model = _text(meta.get("model")) or (_text(row.model) if row else None) or ""
        spawned: dict[str, int] = {}
        box_span = None
        if box is not None:
            box_span = self._box(session, box, min(start, box.created or start), max(end, box.ended or end), parent, extra)
        if row is not None or tape:
            agent = self._agent(session, row, meta, outcome, model, (start, end), parent if box_span is None else box_span, extra if box_span is None else {})
            spawned = self._tape(session, tape, agent, model)
            holder: int | None = agent
        else:
            holder = box_span
        for child in sorted(self.children.get(session, []), key=self._started):
            self.session(child, spawned.get(child, holder), {})

    def _started(self, session: str) -> float:
        row, box = self.rows.get(session), self.boxes.get(session)
        return (row.started if row and _num(row.started) else None) or (box.created if box and box.created else None) or 0.0

    def _box(self, session: str, box: BoxLife, start: float, end: float, parent: int | None, extra: Mapping[str, Any]) -> int:
        attributes = {
            "quinebox.session": session,
            "quinebox.box.kind": "agent" if box.agent else "command",
            "quinebox.parent_session": box.parent,
            "quinebox.grants": box.grants,
            "quinebox.image": _text(box.image),
            "process.exit.code": box.exit_code,
            "quinebox.termination": _text(box.termination),
            **extra,
        }
        index = self.add("box", start, end, parent, attributes)
        if box.ended is None:
            self.spans[index].attributes["quinebox.state"] = "running"
        elif box.exit_code:
            self.spans[index].error = f"exit {box.exit_code} ({_text(box.termination) or 'exit'})"
        return index

    def _agent(self, session: str, row: SessionRow | None, meta: dict[str, Any], outcome: dict[str, Any] | None, model: str,
               times: tuple[float, float], parent: int | None, extra: Mapping[str, Any]) -> int:
        mission = _text(meta.get("mission"), MISSION_CHARS) or (_text(row.mission, MISSION_CHARS) if row else None)
        forked_from = meta.get("forked_from")
        forked = forked_from if isinstance(forked_from, dict) else {}
        result = outcome or {}
        exit_code = _int(result.get("exit_code")) if outcome else (_int(row.exit_code) if row else None)
        termination = _text(result.get("termination")) if outcome else (_text(row.termination) if row else None)
        attributes = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.id": session,
            "gen_ai.agent.name": AGENT_NAME,
            "gen_ai.conversation.id": session,
            "gen_ai.provider.name": provider_of(model) if model else None,
            "gen_ai.request.model": model or None,
            "quinebox.session": session,
            "quinebox.mission": mission,
            "quinebox.depth": _int(meta.get("depth")),
            "quinebox.exit_code": exit_code,
            "quinebox.termination": termination,
            "quinebox.turns": _int(result.get("turns")) if outcome else (_int(row.turns) if row else None),
            "quinebox.tokens": _int(result.get("tokens")) if outcome else (_int(row.tokens) if row else None),
            "quinebox.forked_from.session": _text(forked.get("session")),
            "quinebox.forked_from.turn": _int(forked.get("turn")),
            **extra,
        }
        index = self.add(f"invoke_agent {AGENT_NAME}", *times, parent, attributes)
        if exit_code is None:
            self.spans[index].attributes["quinebox.state"] = "running"
        elif exit_code:
            self.spans[index].error = f"exit {exit_code} ({termination or 'failed'})"
        return index

    def _tape(self, session: str, tape: list[dict[str, Any]], agent: int, model: str) -> dict[str, int]:
        """Turns, model calls and tool calls from one tape; returns the span each child was started under."""
        walk = _Walk(self, session, agent, model)
        for record in tape:
            walk.step(record)
        walk.finish()
        attributes = self.spans[agent].attributes
        attributes["gen_ai.usage.input_tokens"] = walk.input_tokens
        attributes["gen_ai.usage.output_tokens"] = walk.output_tokens
        attributes["quinebox.cycles"] = walk.cycles
        if walk.terminated:
            attributes["quinebox.terminated"] = walk.terminated
        return walk.spawned


class _Walk:
    """One pass over a tape: a turn opens at its request; each answer record closes the next call of the response before it."""

    def __init__(self, builder: _Builder, session: str, agent: int, model: str):
        self.b = builder
        self.session = session
        self.agent = agent
        self.model = model
        self.turn: int | None = None  # the open turn's span
        self.requested: float | None = None  # when the open turn's model call was asked for
        self.calls = ToolCalls()  # which of the response's calls each answer closes
        self.since = 0.0  # when the next tool call began: the response, or the answer before it
        self.waiting: list[str] = []  # children started by the tool call now running
        self.spawned: dict[str, int] = {}
        self.input_tokens = self.output_tokens = self.cycles = 0
        self.terminated: str | None = None
        self.last = 0.0

    def step(self, record: dict[str, Any]) -> None:
        kind, t = record["kind"], float(record["t"])
        call = self.calls.step(record)  # a request leaves the calls alone: the turn closes those still open
        if kind == "request":
            self.close_turn()
            number = _int(record.get("turn"))
            name = f"turn {number}" if number is not None else "turn"
            self.turn = self.b.add(name, t, t, self.agent, {"quinebox.turn": number, "quinebox.cycle": _int(record.get("cycle"))})
            self.requested = t
        elif kind == "response":
            self.chat(record, t)
        elif kind == "provider_error":
            index = self.chat_span(self.requested if self.requested is not None else t, t)
            self.b.spans[index].attributes["error.type"] = _text(record.get("termination")) or "provider_error"
            self.b.spans[index].error = _text(record.get("message")) or "the model provider failed"
            self.requested = None
        elif kind in ANSWERS:
            self.answer(record, kind, call, t)
        elif kind == "cycle":
            self.cycles += 1  # the host's record of a new conversation starting after an exec call
        elif kind == "spawn" and isinstance(record.get("child"), str):
            self.waiting.append(record["child"])
        elif kind == "terminated":
            self.terminated = _text(record.get("termination")) or "terminated"
        if kind not in ("outcome", "meta"):
            self.last = max(self.last, t)
            if self.turn is not None:
                self.b.stretch(self.turn, t)

    def chat_span(self, start: float, end: float) -> int:
        attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider_of(self.model) if self.model else None,
            "gen_ai.request.model": self.model or None,
            "gen_ai.conversation.id": self.session,
        }
        return self.b.add(f"chat {self.model}" if self.model else "chat", start, end, self.turn if self.turn is not None else self.agent, attributes, kind="client")

    def chat(self, record: dict[str, Any], t: float) -> None:
        latency = _num(record.get("latency_s"))
        start = t - latency if latency is not None and latency >= 0 else (self.requested if self.requested is not None else t)
        if self.requested is not None:
            start = max(start, self.requested)
        index = self.chat_span(start, t)
        given = record.get("usage")
        usage = given if isinstance(given, dict) else {}
        attributes = self.b.spans[index].attributes
        for key, name in (("prompt_tokens", "gen_ai.usage.input_tokens"), ("completion_tokens", "gen_ai.usage.output_tokens")):
            count = _int(usage.get(key))
            if count is not None:
                attributes[name] = count
        self.input_tokens += _int(usage.get("prompt_tokens")) or 0
        self.output_tokens += _int(usage.get("completion_tokens")) or 0
        reason = _text(record.get("finish_reason"))
        if reason:
            attributes["gen_ai.response.finish_reasons"] = [reason]
        self.requested = None
        self.since = t

    def answer(self, record: dict[str, Any], kind: str, call: Call | None, t: float) -> None:
        """The span of the call `record` answers (as the tape says, when it outran its response's calls)."""
        name = _text(call.name if call else None) or (kind if kind in ("exit", "exec") else _text(record.get("name"))) or "unknown"
        index = self.tool_span(_text(call.id) if call else None, name, self.since, t)
        attributes = self.b.spans[index].attributes
        if kind == "tool" and _int(record.get("exit_code")) is not None:
            attributes["quinebox.tool.exit_code"] = record["exit_code"]
        if kind == "tool_error":
            attributes["error.type"] = "tool_error"
            self.b.spans[index].error = _text(record.get("error")) or "the tool call failed"
        self.since = t

    def tool_span(self, call_id: str | None, name: str, start: float, end: float) -> int:
        attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name, "gen_ai.tool.type": "function", "gen_ai.tool.call.id": call_id}
        index = self.b.add(f"execute_tool {name}", start, end, self.turn if self.turn is not None else self.agent, attributes)
        for child in self.waiting:
            self.spawned.setdefault(child, index)
        self.waiting = []
        return index

    def close_turn(self) -> None:
        """What a turn left open when the next began or the session ended: a model call or tool calls never answered."""
        if self.requested is not None:
            index = self.chat_span(self.requested, max(self.requested, self.last))
            self.b.spans[index].attributes["error.type"] = "incomplete"
            self.b.spans[index].error = "no answer was recorded"
            self.requested = None
        for call in self.calls.unanswered():
            index = self.tool_span(_text(call.id), _text(call.name) or "unknown", self.since, max(self.since, self.last))
            self.b.spans[index].attributes["error.type"] = "incomplete"
            self.b.spans[index].error = "no result was recorded"

    def finish(self) -> None:
        self.close_turn()

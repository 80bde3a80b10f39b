"""The spans of a recorded tree (quinebox/view/traces.py): records in, span descriptions out, no SDK and no state dir."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quinebox.agent.store import SessionRow
from quinebox.view.traces import Run, Span, build

T0 = 1_800_000_000.0


def row(session, parent=None, *, started=0.0, ended=9.0, exit_code=0, tokens=0, turns=0, model="m", mission="do it"):
    return SessionRow(session, parent, mission, model, T0 + started, None if ended is None else T0 + ended, exit_code,
                      None if exit_code is None else ("exit_success" if exit_code == 0 else "crashed"), tokens, turns)


def rec(kind, t, **fields):
    return {"t": T0 + t, "kind": kind, **fields}


def meta(session, t=0.0, parent=None, **fields):
    return rec("meta", t, **{"session": session, "parent": parent, "mission": "do it", "model": "m", "grants": [], "depth": 0, **fields})


def request(t, turn, cycle=0):
    return rec("request", t, turn=turn, cycle=cycle, digest="d", messages=[{"role": "user", "content": "hidden message"}])


def response(t, turn, *calls, usage=(10, 5), latency=0.5, finish="tool_calls"):
    tool_calls = [{"id": cid, "type": "function", "function": {"name": name, "arguments": "{\"command\": \"hidden args\"}"}} for cid, name in calls]
    return rec("response", t, turn=turn, message={"role": "assistant", "content": "hidden thought", "tool_calls": tool_calls or None},
               usage={"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}, finish_reason=finish, latency_s=latency)


def tool(t, turn, name="sh", exit_code=0):
    return rec("tool", t, turn=turn, name=name, args={"command": "hidden args"}, exit_code=exit_code, result="hidden result")


def outcome(t, exit_code=0, tokens=15, turns=1):
    return rec("outcome", t, exit_code=exit_code, termination="exit_success" if exit_code == 0 else "exit_failure", duration_s=t, tokens=tokens, turns=turns)


def iso(t):
    return datetime.fromtimestamp(T0 + t, timezone.utc).isoformat(timespec="microseconds")


def created(session, t, parent=None, agent=True, grants=("spawn:1",)):
    return {"kind": "box_created", "session": session, "time": iso(t), "facts": {"parent": parent, "agent": agent, "grants": list(grants), "image": "img"}}


def ended(session, t, code=0, termination="exit"):
    return {"kind": "box_ended", "session": session, "time": iso(t), "facts": {"exit": code, "termination": termination}}


SIMPLE = [
    meta("a"),
    request(1.0, 1), response(2.0, 1, ("c1", "sh")), tool(3.0, 1), rec("revision", 3.5, rev=1, turn=1, what="sh", command="x", files=1, bytes=2),
    request(4.0, 2), response(5.0, 2, ("c2", "exit"), usage=(20, 7)), rec("exit", 5.5, turn=1, status="success", reason="hidden reason"),
    outcome(6.0, tokens=42, turns=2),
]


def spans_of(tapes, rows=None, audit=(), roots=("a",), run=None):
    rows = rows if rows is not None else {s: row(s) for s in tapes}
    return build(list(roots), rows, tapes, list(audit), run)


def shape(spans: list[Span]):
    """Each span as (name, its parent's name)."""
    return [(s.name, None if s.parent is None else spans[s.parent].name) for s in spans]


def seconds(span: Span):
    return (round(span.start_ns / 1e9 - T0, 3), round(span.end_ns / 1e9 - T0, 3))


def test_a_session_is_an_agent_span_with_its_turns_model_calls_and_tool_calls():
    assert shape(spans_of({"a": SIMPLE})) == [
        ("invoke_agent quinebox", None),
        ("turn 1", "invoke_agent quinebox"), ("chat m", "turn 1"), ("execute_tool sh", "turn 1"),
        ("turn 2", "invoke_agent quinebox"), ("chat m", "turn 2"), ("execute_tool exit", "turn 2"),
    ]


@pytest.mark.parametrize(
    ("index", "start", "end"),
    [
        (0, 0.0, 6.0),  # the agent: meta .. outcome
        (1, 1.0, 3.5),  # a turn: its request .. the last record before the next request (the revision)
        (2, 1.5, 2.0),  # a model call: its answer's time less its latency
        (3, 2.0, 3.0),  # a tool call: the answer .. the tool's record
        (4, 4.0, 5.5),
        (5, 4.5, 5.0),
        (6, 5.0, 5.5),
    ],
)
def test_times_are_the_recorded_ones(index, start, end):
    assert seconds(spans_of({"a": SIMPLE})[index]) == (start, end)


@pytest.mark.parametrize(
    ("index", "expected"),
    [
        (0, {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.id": "a", "gen_ai.agent.name": "quinebox", "gen_ai.request.model": "m",
             "gen_ai.usage.input_tokens": 30, "gen_ai.usage.output_tokens": 12, "quinebox.tokens": 42, "quinebox.turns": 2,
             "quinebox.exit_code": 0, "quinebox.termination": "exit_success", "quinebox.mission": "do it", "quinebox.cycles": 0}),
        (1, {"quinebox.turn": 1, "quinebox.cycle": 0}),
        (2, {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m", "gen_ai.provider.name": "openai", "gen_ai.conversation.id": "a",
             "gen_ai.usage.input_tokens": 10, "gen_ai.usage.output_tokens": 5, "gen_ai.response.finish_reasons": ["tool_calls"]}),
        (3, {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "sh", "gen_ai.tool.call.id": "c1", "gen_ai.tool.type": "function", "quinebox.tool.exit_code": 0}),
        (5, {"gen_ai.usage.input_tokens": 20, "gen_ai.usage.output_tokens": 7}),
        (6, {"gen_ai.tool.name": "exit", "gen_ai.tool.call.id": "c2"}),
    ],
)
def test_attributes_follow_the_genai_conventions(index, expected):
    span = spans_of({"a": SIMPLE})[index]
    assert {k: span.attributes.get(k) for k in expected} == expected
    assert span.error is None


def test_no_message_argument_or_result_reaches_a_span():
    text = json.dumps([(s.name, s.attributes, s.error) for s in spans_of({"a": SIMPLE})])
    assert "hidden" not in text


def test_kinds_and_providers():
    spans = spans_of({"a": [meta("a", model="script:/x/y.yaml"), request(1, 1), response(2, 1), outcome(3)]})
    chat = spans[2]
    assert (chat.name, chat.kind, chat.attributes["gen_ai.provider.name"]) == ("chat script:/x/y.yaml", "client", "quinebox.script")
    assert spans[0].kind == "internal"


def test_a_box_holds_its_agent_and_spans_both_their_lives():
    audit = [created("a", 0.5, grants=["spawn:1", "secret:API_TOKEN@api.test"]), ended("a", 6.5)]
    spans = spans_of({"a": SIMPLE}, audit=audit)
    assert shape(spans)[:2] == [("box", None), ("invoke_agent quinebox", "box")]
    assert seconds(spans[0]) == (0.0, 6.5)  # from the session's first record (its world and image being made) to the box's removal
    assert spans[0].attributes == {"quinebox.session": "a", "quinebox.box.kind": "agent", "quinebox.grants": ["spawn:1", "secret:API_TOKEN@api.test"],
                                   "quinebox.image": "img", "process.exit.code": 0, "quinebox.termination": "exit"}


PARENT = [
    meta("a"), request(1.0, 1), response(2.0, 1, ("c1", "fork"), ("c2", "sh")),
    rec("spawn", 2.1, child="b", what="run", grants=[], detached=False),
    tool(3.0, 1, name="fork"),
    rec("spawn", 3.2, child="x", what="exec", grants=[], detached=False),
    tool(4.0, 1, name="sh"),
    outcome(5.0),
]
CHILD = [meta("b", 2.2, parent="a"), request(2.3, 1), response(2.4, 1, ("k", "exit")), rec("exit", 2.5, turn=1, status="success"), outcome(2.6)]
FAMILY_AUDIT = [created("a", 0.1), created("b", 2.15, parent="a"), created("x", 3.3, parent="a", agent=False, grants=()),
                ended("x", 3.9, code=3), ended("b", 2.7), ended("a", 5.1)]


def test_children_hang_under_the_tool_call_that_started_them():
    spans = spans_of({"a": PARENT, "b": CHILD}, rows={"a": row("a"), "b": row("b", "a", started=2.2)}, audit=FAMILY_AUDIT)
    boxes = {s.attributes["quinebox.session"]: i for i, s in enumerate(spans) if s.name == "box"}
    assert spans[spans[boxes["b"]].parent].attributes["gen_ai.tool.call.id"] == "c1"
    assert spans[spans[boxes["x"]].parent].attributes["gen_ai.tool.call.id"] == "c2"
    assert spans[boxes["x"]].attributes["quinebox.box.kind"] == "command"
    assert (spans[boxes["x"]].error, spans[boxes["x"]].attributes["process.exit.code"]) == ("exit 3 (exit)", 3)
    [child_agent] = [s for s in spans if s.attributes.get("gen_ai.agent.id") == "b"]
    assert spans[child_agent.parent] is spans[boxes["b"]]


def test_without_the_audit_log_a_child_agent_hangs_under_the_tool_call_itself():
    spans = spans_of({"a": PARENT, "b": CHILD}, rows={"a": row("a"), "b": row("b", "a", started=2.2)})
    [child_agent] = [s for s in spans if s.attributes.get("gen_ai.agent.id") == "b"]
    assert spans[child_agent.parent].attributes["gen_ai.tool.call.id"] == "c1"


def test_a_child_without_a_spawn_record_hangs_under_its_parents_agent():
    spans = spans_of({"a": SIMPLE, "b": CHILD}, rows={"a": row("a"), "b": row("b", "a", started=2.2)})
    [child_agent] = [s for s in spans if s.attributes.get("gen_ai.agent.id") == "b"]
    assert spans[child_agent.parent].attributes["gen_ai.agent.id"] == "a"


def test_exec_renewals_are_a_tool_call_and_a_new_cycle():
    tape = [
        meta("a"), request(1, 1), response(2, 1, ("c1", "exec")), rec("exec", 2.5, turn=1, cycle=1, note="hidden note"),
        rec("cycle", 3.0, cycle=1), request(3.5, 2, cycle=1), response(4, 2, ("c2", "exit")), rec("exit", 4.5, turn=1, status="success"),
        outcome(5),
    ]
    spans = spans_of({"a": tape})
    assert [s.name for s in spans] == ["invoke_agent quinebox", "turn 1", "chat m", "execute_tool exec", "turn 2", "chat m", "execute_tool exit"]
    assert seconds(spans[3]) == (2.0, 2.5) and seconds(spans[1]) == (1.0, 3.0)  # the turn lasts until the new conversation began
    assert spans[4].attributes["quinebox.cycle"] == 1 and spans[0].attributes["quinebox.cycles"] == 1
    assert spans[6].attributes["gen_ai.tool.call.id"] == "c2"  # the guest counts turns per cycle; the order still matches
    assert "hidden" not in json.dumps([s.attributes for s in spans])


@pytest.mark.parametrize(
    ("records", "name", "error", "error_type"),
    [
        ([rec("tool_error", 3, turn=1, name="nope", error="error: unknown tool 'nope'")], "execute_tool nope", "error: unknown tool 'nope'", "tool_error"),
        ([rec("provider_error", 3, turn=1, termination="provider_unavailable", message="down")], "chat m", "down", "provider_unavailable"),
    ],
)
def test_failures_are_error_spans(records, name, error, error_type):
    head = [meta("a"), request(1, 1)] + ([response(2, 1, ("c1", "nope"))] if name.startswith("execute_tool") else [])
    spans = spans_of({"a": head + records + [outcome(4, exit_code=1)]}, rows={"a": row("a", exit_code=1)})
    [span] = [s for s in spans if s.name == name]
    assert (span.error, span.attributes["error.type"]) == (error, error_type)
    assert spans[0].error == "exit 1 (exit_failure)"


def test_an_unfinished_session_ends_at_its_last_record_and_says_what_was_left_open():
    tape = [meta("a"), request(1, 1), response(2, 1, ("c1", "fork")), rec("spawn", 2.5, child="b", what="run"), rec("egress", 3.0, allowed=True)]
    spans = spans_of({"a": tape}, rows={"a": row("a", ended=None, exit_code=None)})
    assert seconds(spans[0]) == (0.0, 3.0) and spans[0].attributes["quinebox.state"] == "running" and spans[0].error is None
    [fork] = [s for s in spans if s.name == "execute_tool fork"]
    assert (seconds(fork), fork.error, fork.attributes["error.type"]) == ((2.0, 3.0), "no result was recorded", "incomplete")
    waiting = spans_of({"a": [meta("a"), request(1, 1)]}, rows={"a": row("a", ended=None, exit_code=None)})
    assert [(s.name, s.error) for s in waiting] == [("invoke_agent quinebox", None), ("turn 1", None), ("chat m", "no answer was recorded")]


def test_a_run_is_one_trace_with_each_input_under_it():
    tapes = {"a": SIMPLE, "c": [meta("c"), outcome(1, exit_code=1)]}
    rows = {"a": row("a"), "c": row("c", exit_code=1)}
    run = Run("map", T0 - 1, T0 + 10, 1, {"a": "one.txt", "c": "two.txt"})
    spans = spans_of(tapes, rows=rows, roots=["a", "c"], run=run)
    assert (spans[0].name, spans[0].parent, spans[0].error, spans[0].attributes["quinebox.run.inputs"]) == ("map", None, "exit 1", 2)
    tops = [s for s in spans if s.parent == 0]
    assert [(s.attributes["gen_ai.agent.id"], s.attributes["quinebox.input"]) for s in tops] == [("a", "one.txt"), ("c", "two.txt")]


def test_a_session_is_spanned_once_even_when_the_index_says_it_is_its_own_ancestor():
    rows = {"a": row("a", "b"), "b": row("b", "a")}
    spans = spans_of({"a": [meta("a")], "b": [meta("b")]}, rows=rows, roots=["a", "b", "a"])
    assert sorted(s.attributes["gen_ai.agent.id"] for s in spans) == ["a", "b"]


def test_an_unknown_root_is_no_span():
    assert spans_of({}, rows={}, roots=["nothing"]) == []


HOSTILE = [
    "not a record", 42, None, [], {"kind": "request"}, {"t": "soon", "kind": "request"}, {"t": T0, "kind": 7},
    meta("a", model=["not", "a", "string"], forked_from="x", depth="deep"),
    rec("request", 1, turn="one", cycle=None),
    rec("response", 2, turn=1, message="not a dict", usage=[1, 2], finish_reason=3, latency_s="fast"),
    rec("response", 2.1, turn=1, message={"tool_calls": "call it"}, usage={"prompt_tokens": "ten", "completion_tokens": True}),
    rec("response", 2.2, message={"tool_calls": [None, 3, {"id": 9, "function": "sh"}, {"function": {"name": ["x"]}}]}, latency_s=-5),
    rec("tool", 3, name=None, exit_code="0"), rec("tool_error", float("nan")), rec("spawn", 3.1, child=5), rec("spawn", 3.2, child="ghost"),
    rec("exit", 3.3), rec("exec", 3.4, turn=None), rec("provider_error", 3.5, message={"no": 1}), rec("terminated", 3.6, termination=[]),
    rec("outcome", 4, exit_code="0", tokens=None, turns=-1),
]
HOSTILE_AUDIT = [None, "x", {"kind": "box_created", "session": "a", "time": "yesterday", "facts": "none"},
                 {"kind": "box_ended", "session": 3}, {"kind": "box_created", "session": "z", "time": iso(1), "facts": {"parent": "a", "grants": "all"}},
                 {"kind": "box_ended", "session": "z", "time": iso(0.5), "facts": {"exit": "1"}}]


def well_formed(spans: list[Span]) -> None:
    for index, span in enumerate(spans):
        assert isinstance(span.name, str) and span.name
        assert span.end_ns >= span.start_ns
        assert span.parent is None or 0 <= span.parent < index
        for value in span.attributes.values():
            assert isinstance(value, (str, bool, int, float)) or (isinstance(value, list) and all(isinstance(v, str) for v in value)), value


def test_a_hostile_tape_and_audit_log_build_well_formed_spans():
    spans = spans_of({"a": HOSTILE}, audit=HOSTILE_AUDIT)
    well_formed(spans)
    assert {"box", "invoke_agent quinebox"} <= {s.name for s in spans}
    [z] = [s for s in spans if s.attributes.get("quinebox.session") == "z"]
    assert z.attributes["quinebox.grants"] == [] and "process.exit.code" not in z.attributes


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=12)
KINDS = st.sampled_from(["meta", "request", "response", "tool", "tool_error", "exit", "exec", "spawn", "provider_error", "terminated", "outcome", "revision"])
RECORD = st.fixed_dictionaries({"t": st.floats(0, 100).map(lambda t: T0 + t) | JSON, "kind": KINDS | JSON}, optional={
    "turn": JSON, "message": st.fixed_dictionaries({}, optional={"tool_calls": JSON}) | JSON, "usage": JSON, "latency_s": JSON,
    "child": st.sampled_from(["b", "a"]) | JSON, "name": JSON, "exit_code": JSON, "cycle": JSON, "finish_reason": JSON,
})


@given(st.lists(RECORD | JSON, max_size=25), st.lists(RECORD | JSON, max_size=6))
def test_any_records_build_well_formed_spans(tape_a, tape_b):
    well_formed(spans_of({"a": tape_a, "b": tape_b}, rows={"a": row("a"), "b": row("b", "a")}))


def test_the_sdk_replays_each_span_with_its_times_parent_status_and_kind():
    from opentelemetry.trace import SpanKind, StatusCode

    from quinebox.view.trace_export import replayed

    spans = spans_of({"a": PARENT, "b": CHILD}, rows={"a": row("a"), "b": row("b", "a", started=2.2)}, audit=FAMILY_AUDIT)
    finished = replayed(spans)
    assert len(finished) == len(spans) and len({f.context.trace_id for f in finished}) == 1
    for span, done in zip(spans, finished):
        attributes = {k: list(v) if isinstance(v, tuple) else v for k, v in done.attributes.items()}  # the SDK keeps sequences as tuples
        assert (done.name, done.start_time, done.end_time, attributes) == (span.name, span.start_ns, span.end_ns, span.attributes)
        assert (done.parent.span_id if done.parent else None) == (None if span.parent is None else finished[span.parent].context.span_id)
        assert done.kind == (SpanKind.CLIENT if span.name.startswith("chat") else SpanKind.INTERNAL)
        assert (done.status.status_code, done.status.description) == ((StatusCode.ERROR, span.error) if span.error else (StatusCode.UNSET, None))
    assert finished[0].resource.attributes["service.name"] == "quinebox"


@pytest.mark.parametrize(
    ("given_url", "environ", "expected"),
    [
        (None, {}, "http://localhost:4318/v1/traces"),
        ("http://collector:4318", {}, "http://collector:4318/v1/traces"),
        ("http://collector:4318/", {}, "http://collector:4318/v1/traces"),
        ("https://collector/custom/path", {}, "https://collector/custom/path"),
        (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}, "http://c:4318/v1/traces"),
        (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t/x"}, "http://t/x"),
        ("http://given:1", {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t/x"}, "http://given:1/v1/traces"),
    ],
)
def test_where_the_spans_go(given_url, environ, expected, monkeypatch):
    from quinebox.view.trace_export import where

    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert where(given_url) == expected


@pytest.mark.parametrize("when", [1e308, -1e308, 1e20, float("inf"), float("-inf"), float("nan")])
def test_a_box_that_writes_any_time_into_its_events_still_gets_well_formed_spans(when):
    """A box sends its events' fields; once it could even send their time. No number may lose the tree its trace."""
    tape = [meta("a"), rec("request", 1, turn=1), rec("response", 2, turn=1), rec("tool", when, turn=1, name="sh"), rec("outcome", 4)]
    well_formed(spans_of({"a": tape}))

"""The one reader of tapes: each kind's record read back whole, and every malformed one passed over and counted."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quinebox.agent.records import Records, Refusal, as_dict, box_record, read_lines

CALL = {"id": "c1", "type": "function", "function": {"name": "sh", "arguments": "{}"}}
#: One well-formed record of every kind, as the host writes it.
GOOD = {
    "meta": {"session": "a", "parent": None, "mission": "m", "model": "script:x", "grants": ["net"], "image": "i", "workdir": None, "depth": 0,
             "tokens": 500, "max_turns": 8, "max_cycles": 2, "ask": ["spawn:2"], "deny": ["net:*"], "ask_timeout": 300.0, "backend": "oci", "runtime": "runsc"},
    "request": {"turn": 1, "cycle": 0, "digest": "d", "messages": [{"role": "user", "content": "hi"}], "material": 12},
    "response": {"turn": 1, "message": {"role": "assistant", "content": None, "tool_calls": [CALL]}, "usage": {"total_tokens": 3}, "finish_reason": "tool_calls", "latency_s": 0.1},
    "provider_error": {"turn": 1, "termination": "provider_unavailable", "message": "down"},
    "cycle": {"cycle": 1},
    "revision": {"rev": 1, "turn": 1, "what": "sh", "command": "ls", "files": 2, "bytes": 3},
    "world_error": {"turn": None, "message": "too many"},
    "restore_world": {"revision": 0, "before": 2, "undone": ["removed /a"]},
    "adopt": {"adopted": ["A /x"]},
    "egress": {"allowed": False, "why": "private"},
    "spawn": {"child": "b", "what": "run", "grants": [], "detached": False},
    "escalation_refused": {"request": {"what": "run"}, "reason": "net"},
    "entered": {"argv": ["sh"], "uid": 1000, "exit_code": 0},
    "box_refused": {"event": "response", "why": "not the box's"},
    "resumed": {"turn": 2, "cycle": 0, "material": 12, "owner": "h:1:2", "answered": True, "revision": 1},
    "outcome": {"exit_code": 0, "termination": "exit_success", "duration_s": 1.5, "tokens": 3, "turns": 1},
    "tool": {"turn": 1, "name": "sh", "args": {"command": "ls"}, "exit_code": 0, "result": "a"},
    "tool_error": {"turn": 1, "name": "x", "error": "unknown tool"},
    "exec": {"turn": 2, "cycle": 1, "note": "n"},
    "exit": {"turn": 3, "status": "success", "reason": ""},
    "terminated": {"turn": 4, "termination": "turn_exhaustion"},
}
#: For each kind, fields that make it no record of that kind.
BAD = {
    "meta": [{"mission": 3}, {"grants": "all"}, {"forked_from": "x"}, {"depth": "deep"}, {"tokens": "many"}, {"ask": "net"}, {"ask_timeout": "soon"}],
    "request": [{"turn": "one"}, {"messages": "hi"}, {"cycle": None}, {"turn": True}, {"material": "some"}],
    "response": [{"message": {"tool_calls": 5}}, {"message": "x"}, {"usage": "lots"}, {"message": {"role": "assistant", "content": None, "tool_calls": [{"function": "sh"}]}},
                 {"message": {"role": "assistant", "content": None, "tool_calls": [{**CALL, "function": {"name": ["sh"], "arguments": ""}}]}}, {"latency_s": "fast"}],
    "provider_error": [{"message": {"no": 1}}],
    "cycle": [{"cycle": "1"}],
    "revision": [{"rev": "latest"}, {"files": None}],
    "world_error": [{"message": None}],
    "restore_world": [{"revision": "x"}, {"undone": "all"}],
    "adopt": [{"adopted": 1}],
    "egress": [{"allowed": "yes"}, {"port": "80"}],
    "spawn": [{"child": {"id": 1}}, {"what": None}],
    "escalation_refused": [{"request": []}],
    "entered": [{"argv": "sh"}],
    "box_refused": [{"why": 1}],
    "resumed": [{"turn": None}, {"material": "all"}, {"answered": "yes"}, {"owner": 5}],
    "outcome": [{"exit_code": "done"}, {"termination": 3}, {"tokens": None}],
    "tool": [{"name": ["sh"]}, {"args": 7}, {"exit_code": "0"}, {"result": {"deep": 1}}],
    "tool_error": [{"error": None}],
    "exec": [{"turn": None}, {"cycle": "1"}],
    "exit": [{"status": "maybe"}],
    "terminated": [{"termination": "timeout"}],
}
JUNK = [b"not json", b"[1, 2]", b"42", b"null", b'{"kind": "response"}', b'{"t": 1, "kind": "nonsense"}', b'{"t": "soon", "kind": "cycle", "cycle": 1}',
        b'{"t": NaN, "kind": "cycle", "cycle": 1}', b"\xff\xfe", b"[" * 100000, b'{"t": 1, "kind": 7}']


def line(kind: str, fields: dict) -> bytes:
    return json.dumps({"t": 1.5, "kind": kind, **fields}).encode()


def test_every_kind_reads_back_as_written():
    tape = read_lines([line(kind, fields) for kind, fields in GOOD.items()])
    assert tape.skipped == 0 and [as_dict(r)["kind"] for r in tape] == list(GOOD)
    for record, (kind, fields) in zip(tape, GOOD.items()):
        written = {"t": 1.5, "kind": kind, **{k: v for k, v in fields.items() if v not in (None, [], False, 0, "") or k in ("content",)}}
        assert {k: v for k, v in as_dict(record).items() if k in written} == written


@pytest.mark.parametrize("kind, bad", [(kind, bad) for kind, bads in BAD.items() for bad in bads])
def test_a_record_with_a_wrong_field_is_passed_over_and_counted(kind, bad):
    tape = read_lines([line("meta", GOOD["meta"]), line(kind, {**GOOD[kind], **bad}), line("outcome", GOOD["outcome"])])
    assert [as_dict(r)["kind"] for r in tape] == ["meta", "outcome"] and tape.skipped == 1


@pytest.mark.parametrize("junk", JUNK)
def test_a_line_that_is_no_record_is_passed_over(junk):
    assert read_lines([junk, b"", line("cycle", {"cycle": 1})]).skipped == 1


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=10)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(list(GOOD)), st.dictionaries(st.sampled_from(sorted({k for f in GOOD.values() for k in f})), JSON, max_size=5))
def test_any_fields_under_any_kind_read_as_that_kind_or_not_at_all(kind, fields):
    tape: Records = read_lines([line(kind, {**GOOD[kind], **fields})])
    assert len(tape) + tape.skipped == 1
    for record in tape:  # what is read is whole: it writes back as JSON and reads back the same
        assert read_lines([json.dumps(as_dict(record)).encode()]).records == [record]


@pytest.mark.parametrize("name", [k for k in GOOD if k not in ("tool", "tool_error", "exec", "exit", "terminated")] + ["", "x" * 100])
def test_a_box_cannot_write_a_kind_of_the_hosts(name):
    with pytest.raises(Refusal, match="not an event a box may record"):
        box_record({"kind": "event", "event": name, **GOOD.get(name, {})}, 1.0)


@pytest.mark.parametrize("name", ["tool", "tool_error", "exec", "exit", "terminated"])
def test_a_box_writes_its_own_kinds_with_the_hosts_time_and_only_their_fields(name):
    record = as_dict(box_record({"kind": "event", "event": name, "t": 9e99, "message": "forged", **GOOD[name]}, 2.0))
    assert record["kind"] == name and record["t"] == 2.0 and "message" not in record


def test_a_tool_call_whose_id_the_server_sent_as_null_reads_back_as_written():
    """Some OpenAI-compatible servers send `"id": null`: the turn must not vanish from show, fork and replay."""
    fields = {**GOOD["response"], "message": {"role": "assistant", "content": None, "tool_calls": [{**CALL, "id": None}]}}
    tape = read_lines([line("response", fields)])
    assert tape.skipped == 0 and as_dict(next(iter(tape)))["message"]["tool_calls"] == [{**CALL, "id": None}]

"""The one walk over a tape's tool calls, as a table: a tape in, the call each record belongs to out."""

from __future__ import annotations

import json

import pytest

from quinebox.agent.tool_calls import Call, ToolCalls, calls_of


def response(*names: str) -> dict:
    return {"kind": "response", "message": {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": json.dumps({"n": i})}} for i, name in enumerate(names)
    ]}}


def call(i: int, name: str) -> Call:
    return Call(f"c{i}", name, json.dumps({"n": i}))


TOOL, ERROR, EXEC, EXIT = ({"kind": k} for k in ("tool", "tool_error", "exec", "exit"))
SPAWN = {"kind": "spawn", "child": "x", "what": "run"}
REQUEST = {"kind": "request", "turn": 2}


@pytest.mark.parametrize(
    ("tape", "calls", "left"),
    [
        ([], [], []),
        ([response()], [None], []),
        ([response("sh")], [None], [call(0, "sh")]),
        # answers close the calls in order, whatever kind of answer
        ([response("sh", "fork"), TOOL, ERROR], [None, call(0, "sh"), call(1, "fork")], []),
        ([response("sh", "exec"), TOOL, EXEC], [None, call(0, "sh"), call(1, "exec")], []),
        ([response("exit"), EXIT], [None, call(0, "exit")], []),
        # a spawn belongs to the call running: the first not answered yet, which stays waiting
        ([response("fork"), SPAWN, SPAWN, TOOL], [None, call(0, "fork"), call(0, "fork"), call(0, "fork")], []),
        ([response("sh", "fork"), TOOL, SPAWN], [None, call(0, "sh"), call(1, "fork")], [call(1, "fork")]),
        # with no call running (a command's tape, or answers that outran the calls) a record belongs to none
        ([SPAWN, TOOL], [None, None], []),
        ([response("sh"), TOOL, TOOL, SPAWN], [None, call(0, "sh"), None, None], []),
        # a new response starts afresh; a request or any other record changes nothing
        ([response("a", "b"), TOOL, response("c"), TOOL], [None, call(0, "a"), None, call(0, "c")], []),
        ([response("a"), REQUEST, {"kind": "cycle"}, {"kind": "revision"}, TOOL], [None, None, None, None, call(0, "a")], []),
        # records as found
        ([None, "x", 3, {"kind": 5}, {}], [None] * 5, []),
    ],
)
def test_which_call_each_record_belongs_to(tape, calls, left):
    walk = ToolCalls()
    assert [walk.step(record) for record in tape] == calls
    assert walk.unanswered() == left
    assert walk.unanswered() == []


@pytest.mark.parametrize(
    ("message", "calls"),
    [
        ({"tool_calls": [{"id": "a", "type": "function", "function": {"name": "sh", "arguments": "{}"}}]}, [Call("a", "sh", "{}")]),
        ({"tool_calls": [{"id": None, "function": {"name": "sh", "arguments": "{}"}}]}, [Call(None, "sh", "{}")]),  # a server's null id
        ({"tool_calls": [{"function": {"name": 3, "arguments": {"a": 1}}}]}, [Call(None, None, None)]),
        ({"tool_calls": [{"function": "sh"}, "call", None]}, [Call(None, None, None)] * 3),
        ({"tool_calls": None}, []),
        ({"tool_calls": "sh"}, []),
        ({"content": "hi"}, []),
        (None, []),
        ("message", []),
    ],
)
def test_the_calls_of_a_message(message, calls):
    assert calls_of(message) == calls


@pytest.mark.parametrize(
    ("arguments", "parsed"),
    [
        ('{"mode": "wait"}', {"mode": "wait"}),
        ("{}", {}),
        ("", {}),
        (None, {}),
        ("{not json", {}),
        ("[1, 2]", {}),
        ('"text"', {}),
        ("null", {}),
    ],
)
def test_the_arguments_of_a_call(arguments, parsed):
    assert Call("c", "fork", arguments).parsed() == parsed

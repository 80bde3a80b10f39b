"""What the view says a record means: states, how a child was started, the critical path (pure, as tables)."""

from __future__ import annotations

import json

import pytest

from quinebox.view.sessions_view import critical_path, how_spawned, so_far, state_of


@pytest.mark.parametrize(
    ("ended", "exit_code", "termination", "alive", "waiting", "state"),
    [
        (None, None, None, True, False, "running"),
        (None, None, None, True, True, "waiting"),
        (None, None, None, False, False, "killed"),  # its owner died without ending it: it will never end
        (None, None, None, False, True, "killed"),
        (10.0, 0, "exit_success", True, False, "done"),
        (10.0, 1, "exit_failure", True, False, "failed"),
        (10.0, 1, "crashed", True, False, "failed"),
        (10.0, 75, "provider_unavailable", True, False, "failed"),
        (10.0, 124, "timeout", True, False, "killed"),
        (10.0, 137, "oom", True, False, "killed"),
        (10.0, 137, "killed", True, False, "killed"),
        (10.0, 143, None, True, False, "killed"),
        (10.0, 125, "engine_lost", True, False, "killed"),
        (10.0, 1, "turn_exhaustion", True, False, "failed"),
        (10.0, 0, "exit_success", False, True, "done"),  # ended is ended, whoever is gone since
    ],
)
def test_state_of(ended, exit_code, termination, alive, waiting, state):
    assert state_of(ended, exit_code, termination, alive=alive, waiting=waiting) == state


@pytest.mark.parametrize(
    ("ended", "alive", "waiting", "paused", "interrupted", "state"),
    [
        (None, True, False, True, False, "paused"),
        (None, True, True, True, False, "paused"),  # its asker is frozen with it
        (None, False, False, True, False, "killed"),  # its owner died: nothing will resume it
        (None, False, False, False, True, "interrupted"),  # an agent `quinebox resume` can go on with
        (None, True, False, False, True, "running"),  # resumed since: its new owner runs it
        (10.0, False, False, True, True, "done"),
    ],
)
def test_state_of_a_box_whose_time_was_revised(ended, alive, waiting, paused, interrupted, state):
    assert state_of(ended, 0 if ended else None, None, alive=alive, waiting=waiting, paused=paused, interrupted=interrupted) == state


def response(*calls: tuple[str, dict]) -> dict:
    return {"kind": "response", "message": {"role": "assistant", "tool_calls": [
        {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}} for i, (name, args) in enumerate(calls)
    ]}}


def spawn(child: str, what: str = "run", detached: bool = False) -> dict:
    return {"kind": "spawn", "child": child, "what": what, "detached": detached}


TOOL = {"kind": "tool", "name": "x"}


@pytest.mark.parametrize(
    ("tape", "child", "how"),
    [
        ([response(("fork", {"mode": "wait", "children": []})), spawn("a")], "a", "fork:wait"),
        ([response(("fork", {"mode": "race"})), spawn("a"), spawn("b")], "b", "fork:race"),
        ([response(("fork", {"mode": "forget"})), spawn("a", detached=True)], "a", "fork:forget"),
        ([response(("fork", {"mode": "sideways"})), spawn("a")], "a", "fork"),
        ([response(("sh", {"command": "echo hi | quinebox run 'say it'"})), spawn("a")], "a", "quinebox run"),
        ([response(("sh", {"command": "quinebox exec -- true"})), spawn("a", "exec")], "a", "quinebox exec"),
        ([response(("sh", {"command": "quinebox run a | quinebox run b"})), spawn("a"), spawn("b")], "a", "pipeline"),
        # the second call of a response runs after the first's tool event
        ([response(("sh", {"command": "ls"}), ("fork", {"mode": "wait"})), TOOL, spawn("a")], "a", "fork:wait"),
        ([response(("fork", {"mode": "race"}), ("sh", {"command": "quinebox run x"})), TOOL, spawn("a")], "a", "quinebox run"),
        # a later response resets what is running
        ([response(("fork", {"mode": "wait"})), spawn("a"), TOOL, response(("fork", {"mode": "forget"})), spawn("b")], "b", "fork:forget"),
        # a spawn with no tool call running (a parent that is a plain command, or a tape cut short)
        ([spawn("a")], "a", "quinebox run"),
        ([response(("sh", {"command": "x"})), TOOL, spawn("a", "exec")], "a", "quinebox exec"),
        ([response(("fork", {"mode": "wait"})), spawn("a")], "zz", None),
        # the model's arguments need not be JSON, nor an object (the record's shape is the typed reader's: test_records.py)
        ([{"kind": "response", "message": {"tool_calls": [{"function": {"name": "fork", "arguments": "{not json"}}]}}, spawn("a")], "a", "fork"),
        ([{"kind": "response", "message": {"tool_calls": [{"function": {"name": "sh", "arguments": "[1, 2]"}}]}}, spawn("a")], "a", "quinebox run"),
        ([], "a", None),
    ],
)
def test_how_a_child_was_started(tape, child, how):
    assert how_spawned(tape, child) == how


def node(id: str, parent: str | None, ended: float | None) -> dict:
    return {"id": id, "parent": parent, "ended": ended}


@pytest.mark.parametrize(
    ("nodes", "path"),
    [
        ([node("r", None, 10)], ["r"]),
        ([node("r", None, 10), node("a", "r", 5), node("b", "r", 8)], ["r", "b"]),
        ([node("r", None, 10), node("a", "r", 5), node("b", "r", 8), node("a1", "a", 4), node("b1", "b", 7.5), node("b2", "b", 2)], ["r", "b", "b1"]),
        # a running child ends "now": it is on the path
        ([node("r", None, None), node("a", "r", 5), node("b", "r", None)], ["r", "b"]),
        ([node("r", None, 10), node("a", "r", 9), node("a1", "a", 8), node("a11", "a1", 7)], ["r", "a", "a1", "a11"]),
    ],
)
def test_the_critical_path_follows_the_child_that_ended_last(nodes, path):
    assert critical_path(nodes, "r", now=100.0) == path


@pytest.mark.parametrize(
    ("tape", "expected"),
    [
        ([], {"turns": 0, "tokens": 0}),
        ([{"kind": "request"}, {"kind": "response", "usage": {"total_tokens": 30}}, {"kind": "response", "usage": {"total_tokens": 12}}], {"turns": 2, "tokens": 42}),
        ([{"kind": "response", "usage": {"total_tokens": None}}, {"kind": "response"}], {"turns": 2, "tokens": 0}),
    ],
)
def test_a_running_sessions_turns_and_tokens_come_from_its_tape(tape, expected):
    assert so_far(tape) == expected

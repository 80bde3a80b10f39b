"""Where an interrupted session goes on from, read from its tape alone: the last complete turn, the turn in flight,
and what was spent by then."""

from __future__ import annotations

import json

import pytest

from quinebox.agent.records import Records, read_lines
from quinebox.agent.resumption import Resumption, ran_for, resumption, spawn_grant, superseded
from quinebox.agent.timeline import conversation_at

SYSTEM = {"role": "system", "content": "You are an agent."}
BEGIN = {"role": "user", "content": "Begin."}


def call(n: int, name: str = "sh", arguments: str = '{"command": "ls"}') -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [{"id": f"c{n}", "type": "function", "function": {"name": name, "arguments": arguments}}]}


def result(n: int, text: str = "ok") -> dict:
    return {"role": "tool", "tool_call_id": f"c{n}", "content": text}


def tape(*records: tuple[float, str, dict]) -> Records:
    return read_lines([json.dumps({"t": t, "kind": kind, **fields}).encode() for t, kind, fields in records])


def meta(t: float = 100.0) -> tuple[float, str, dict]:
    return (t, "meta", {"session": "s", "mission": "m", "model": "script:x"})


def request(t: float, turn: int, messages: list[dict], *, cycle: int = 0, material: int | None = None) -> tuple[float, str, dict]:
    fields: dict = {"turn": turn, "cycle": cycle, "digest": "d", "messages": messages}
    if material is not None:
        fields["material"] = material
    return (t, "request", fields)


def response(t: float, turn: int, message: dict, tokens: int = 10) -> tuple[float, str, dict]:
    return (t, "response", {"turn": turn, "message": message, "usage": {"prompt_tokens": tokens - 1, "completion_tokens": 1, "total_tokens": tokens}})


def tool(t: float, turn: int) -> tuple[float, str, dict]:
    return (t, "tool", {"turn": turn, "name": "sh", "args": {"command": "ls"}, "exit_code": 0, "result": "ok"})


def spawn(t: float, child: str, grants: list[str] | None = None) -> tuple[float, str, dict]:
    return (t, "spawn", {"child": child, "what": "run", "grants": grants or []})


def resumed(t: float, turn: int, answered: bool) -> tuple[float, str, dict]:
    return (t, "resumed", {"turn": turn, "cycle": 0, "material": 0, "owner": "h:1:2", "answered": answered})


def test_a_session_lost_before_it_asked_its_model_starts_afresh():
    point = resumption(tape(meta(100.0), (101.5, "revision", {"rev": 0, "files": 0, "bytes": 0})))
    assert point == Resumption(ran_for=1.5)
    assert point.messages == [] and point.answer is None and point.asked_at is None and point.turn == 1


def test_the_turn_in_flight_is_the_last_asked_and_its_recorded_answer_runs_again():
    records = tape(
        meta(100.0),
        request(101.0, 1, [SYSTEM, BEGIN], material=0),
        response(101.1, 1, call(1), tokens=10),
        tool(101.2, 1),
        request(102.0, 2, [result(1)], material=3),
        response(102.1, 2, call(2), tokens=20),
        (102.2, "egress", {"allowed": False, "why": "none"}),
    )
    point = resumption(records)
    assert (point.turn, point.cycle, point.turn_in_cycle, point.asked_at, point.material) == (2, 0, 2, 102.0, 3)
    assert point.messages == [SYSTEM, BEGIN, call(1), result(1)]  # turn 1 is complete: its result is in turn 2's request
    assert point.answer == {"message": call(2), "usage": {"prompt_tokens": 19, "completion_tokens": 1, "total_tokens": 20}}
    assert (point.tokens, point.answers) == (30, 2)  # the answer taken again is spent once, already
    assert point.ran_for == pytest.approx(2.2)


def test_with_no_answer_recorded_the_model_is_asked_again():
    point = resumption(tape(meta(), request(101.0, 1, [SYSTEM, BEGIN]), response(101.1, 1, call(1)), request(102.0, 2, [result(1)])))
    assert point.turn == 2 and point.answer is None and point.answers == 1
    assert point.material is None  # a guest that did not count its material: the tape does not say


def test_after_an_exec_the_conversation_is_the_new_one_and_the_turn_budget_counts_from_it():
    note = {"role": "user", "content": "You are continuing earlier work."}
    point = resumption(tape(
        meta(),
        request(101.0, 1, [SYSTEM, BEGIN], material=0),
        response(101.1, 1, call(1, "exec", '{"note": "n"}')),
        (101.2, "exec", {"turn": 1, "cycle": 1, "note": "n"}),
        (101.3, "cycle", {"cycle": 1}),
        request(102.0, 2, [SYSTEM, note], cycle=1, material=5),
        response(102.1, 2, call(2)),
        tool(102.2, 1),
        request(103.0, 3, [result(2)], cycle=1, material=9),
    ))
    assert (point.turn, point.cycle, point.turn_in_cycle, point.material) == (3, 1, 2, 9)
    assert point.messages == [SYSTEM, note, call(2), result(2)]


def test_children_of_complete_turns_are_kept_and_charged_those_of_the_turn_in_flight_start_again():
    point = resumption(tape(
        meta(),
        request(101.0, 1, [SYSTEM, BEGIN]),
        response(101.1, 1, call(1, "fork")),
        spawn(101.2, "kept1", ["mem:1g", "spawn:2", "depth:1"]),
        spawn(101.3, "kept2"),
        tool(101.4, 1),
        request(102.0, 2, [result(1)]),
        response(102.1, 2, call(2, "fork")),
        spawn(102.2, "in-flight"),
    ))
    assert point.children == ("kept1", "kept2")
    assert point.spawn_costs == (3, 1)  # itself, and the children it may start in turn


def test_a_session_resumed_before_goes_on_from_its_latest_request_without_what_its_lost_turns_started():
    records = tape(
        meta(100.0),
        request(101.0, 1, [SYSTEM, BEGIN], material=0),
        response(101.1, 1, call(1), tokens=10),
        tool(101.2, 1),
        request(102.0, 2, [result(1)], material=3),
        spawn(102.5, "lost"),  # the first run's turn in flight: it died with it
        (130.0, "egress", {"allowed": False, "why": "none"}),
        resumed(500.0, 2, answered=False),
        request(500.1, 2, [], material=3),  # the same turn asked again: no message the tape has not
        response(500.2, 2, call(2), tokens=20),
        spawn(500.3, "again"),
        tool(500.4, 2),
        request(501.0, 3, [result(2)], material=7),
        response(501.1, 3, call(3), tokens=30),
        (520.0, "egress", {"allowed": False, "why": "none"}),
    )
    point = resumption(records)
    assert (point.turn, point.turn_in_cycle, point.material, point.asked_at) == (3, 3, 7, 501.0)
    assert point.messages == [SYSTEM, BEGIN, call(1), result(1), call(2), result(2)]
    assert point.answer is not None and point.answer["message"] == call(3)
    assert point.children == ("again",) and point.spawn_costs == (1,)
    assert (point.tokens, point.answers) == (60, 3)
    assert point.ran_for == pytest.approx(30.0 + 20.0)  # each run to its last record; the time between is nobody's


def test_superseded_is_what_lay_between_the_last_request_and_each_resume():
    records = list(tape(
        meta(), request(1, 1, [BEGIN]), response(2, 1, call(1)), tool(3, 1), resumed(4, 1, True),
        tool(5, 1), request(6, 2, [result(1)]), resumed(7, 2, False),
    ))
    assert superseded(records) == {2, 3}
    assert superseded(list(tape(meta(), spawn(1, "x"), resumed(2, 1, False)))) == {1}  # lost before any request
    assert superseded(list(tape(meta(), request(1, 1, [BEGIN])))) == set()


def test_a_turn_asked_again_has_the_conversation_it_was_first_asked_with():
    records = tape(meta(), request(1, 1, [SYSTEM, BEGIN]), resumed(2, 1, False), request(3, 1, []), response(4, 1, call(1)))
    asked = conversation_at(records, 1)
    assert asked is not None and asked[0].t == 1 and asked[1] == [SYSTEM, BEGIN]
    assert conversation_at(records, 2) is None


@pytest.mark.parametrize("grants, children", [([], 0), (["spawn:3"], 3), (["depth:2", "spawn:1"], 1), (["spawn:x"], 0), (["spawner:4"], 0)])
def test_the_children_a_child_may_start_come_from_its_recorded_grants(grants, children):
    assert spawn_grant(grants) == children


def test_time_ran_is_nothing_for_an_empty_tape():
    assert ran_for(Records()) == 0.0

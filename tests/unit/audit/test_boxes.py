"""The one reading of a box's `box_created` and `box_ended` audit records, as a table: records in, a box's life out."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from quinebox.audit.boxes import BoxLife, box_lives, take

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


def at(seconds: float) -> str:
    return datetime.fromtimestamp(T0.timestamp() + seconds, timezone.utc).isoformat()


START, END = at(0), at(5)


def created(session="s1", time=START, **facts):
    return {"kind": "box_created", "session": session, "time": time, "facts": facts}


def ended(session="s1", time=END, **facts):
    return {"kind": "box_ended", "session": session, "time": time, "facts": facts}


T = T0.timestamp()
FULL = dict(parent="p0", agent=True, owner="host:1:2", grants=["mem:1g", "ro:/src"], image="python:3.12-slim")


@pytest.mark.parametrize(
    ("records", "boxes"),
    [
        ([], {}),
        # what the tree writes, as it writes it
        ([created(**FULL)], {"s1": BoxLife("s1", created=T, parent="p0", agent=True, owner="host:1:2", grants=["mem:1g", "ro:/src"], image="python:3.12-slim")}),
        ([created(**FULL), ended(exit=0, termination="exit")],
         {"s1": BoxLife("s1", created=T, ended=T + 5, parent="p0", agent=True, owner="host:1:2", grants=["mem:1g", "ro:/src"], image="python:3.12-slim",
                        exit_code=0, termination="exit")}),
        ([created(), ended(exit=137, termination="oom")], {"s1": BoxLife("s1", created=T, ended=T + 5, exit_code=137, termination="oom")}),
        # a command box: no parent, not an agent
        ([created(agent=False, parent=None, owner="h:2:3")], {"s1": BoxLife("s1", created=T, owner="h:2:3")}),
        # two boxes, each by its session; other kinds of record are no box's
        ([created("a"), {"kind": "approval_asked", "session": "a", "facts": {}}, created("b", parent="a"), ended("a", exit=1)],
         {"a": BoxLife("a", created=T, ended=T + 5, exit_code=1), "b": BoxLife("b", created=T, parent="a")}),
        # an end seen without its start (a log cut short) still says how the box ended
        ([ended(exit=0, termination="exit")], {"s1": BoxLife("s1", ended=T + 5, exit_code=0, termination="exit")}),
        # fields of the wrong type are left out, never trusted or crashed on
        ([created(parent=3, agent="yes", owner=7, grants="all", image=["x"])], {"s1": BoxLife("s1", created=T)}),
        ([created(grants=["mem:1g", 3, None, "rw:/w"])], {"s1": BoxLife("s1", created=T, grants=["mem:1g", "rw:/w"])}),
        ([created(owner="")], {"s1": BoxLife("s1", created=T)}),
        ([created(agent=1)], {"s1": BoxLife("s1", created=T)}),  # only true is true
        ([ended(exit=True, termination=5)], {"s1": BoxLife("s1", ended=T + 5)}),
        ([ended(exit="0")], {"s1": BoxLife("s1", ended=T + 5)}),
        ([created(time="yesterday"), ended(time=None)], {"s1": BoxLife("s1")}),
        ([created(time="0001-01-01T00:00:00")], {"s1": BoxLife("s1")}),  # a time this platform cannot count in seconds
        ([{"kind": "box_created", "session": "s1", "time": at(0), "facts": "none"}], {"s1": BoxLife("s1", created=T)}),
        ([{"kind": "box_created", "session": "s1", "time": at(0)}], {"s1": BoxLife("s1", created=T)}),
        # records that name no box
        ([None, "x", 3, [], {"kind": "box_created"}, {"kind": "box_ended", "session": 3}, {"session": "s1", "facts": {}}], {}),
    ],
)
def test_a_box_life_from_its_audit_records(records, boxes):
    assert box_lives(records) == boxes


def test_take_folds_one_record_and_says_which_box_it_told_of():
    boxes: dict[str, BoxLife] = {}
    assert take(boxes, {"kind": "kill", "session": "s1"}) is None and boxes == {}
    first = take(boxes, created(parent="p"))
    assert first is boxes["s1"] and first.parent == "p" and first.ended is None
    assert take(boxes, ended(exit=0)) is first and first.exit_code == 0 and first.parent == "p"


def note(kind, session="s1", time=START, **facts):
    return {"kind": kind, "session": session, "time": time, "facts": facts}


@pytest.mark.parametrize(
    ("records", "moments", "paused"),
    [
        ([created()], [], False),
        ([created(), note("box_paused", time=at(1))], [{"t": T + 1, "what": "paused"}], True),
        ([created(), note("box_paused", time=at(1)), note("box_resumed", time=at(3), paused_s=2)],
         [{"t": T + 1, "what": "paused"}, {"t": T + 3, "what": "resumed", "paused_s": 2.0}], False),
        # paused, then ended: an ended box is not paused
        ([created(), note("box_paused", time=at(1)), ended()], [{"t": T + 1, "what": "paused"}], False),
        ([created(), note("snapshot_taken", time=at(2), snapshot="n-1", bytes=268435456, transient=True)],
         [{"t": T + 2, "what": "snapshot", "snapshot": "n-1", "bytes": 268435456, "transient": True}], False),
        ([note("box_restored", snapshot="n-1", box="s0")], [{"t": T, "what": "restored", "snapshot": "n-1", "box": "s0"}], False),
        ([note("session_resumed", turn=4, was="h:1:2", lost=["c"])], [{"t": T, "what": "resumed after its host died", "turn": 4}], False),
        # facts of the wrong type are left out; facts not shown are not kept
        ([note("snapshot_taken", snapshot=3, bytes="big", transient="yes", secret="x")], [{"t": T, "what": "snapshot"}], False),
        ([note("box_resumed", paused_s=True), note("session_resumed", turn=False)],
         [{"t": T, "what": "resumed"}, {"t": T, "what": "resumed after its host died"}], False),
        ([note("box_paused", time="never")], [{"t": None, "what": "paused"}], True),
    ],
)
def test_a_box_s_time_revised_from_its_audit_records(records, moments, paused):
    box = box_lives(records)["s1"]
    assert box.moments == moments
    assert box.paused is paused

"""`quinebox resume`'s refusals (one line, nothing started), its lock, and how it passes over the material the
session had read; the rest (a real run killed and resumed, on each backend) is e2e (tests/e2e/test_resume.py)."""

from __future__ import annotations

import os
import socket

import pytest

from quinebox.agent.store import Index
from quinebox.errors import ErrorKind, QuineboxError
from quinebox.processes import owner_id
from quinebox.state import session_dir
from quinebox.tree.resume import _gone, _lock, passed_over, resumable

GONE = f"{socket.gethostname()}:999999999:1"


@pytest.fixture
def index():
    opened = Index()
    yield opened
    opened.close()


def started(index: Index, name: str, *, owner: str | None = GONE, parent: str | None = None) -> str:
    session = f"{name}-{os.urandom(3).hex()}"
    index.start(session, parent=parent, mission="m", model="script:x", owner=owner)
    session_dir(session).mkdir(parents=True, exist_ok=True)
    return session


def test_an_interrupted_root_may_be_resumed(index):
    session = started(index, "lost")
    row = resumable(index, session[:10])
    assert row.id == session
    _gone(index, row)


@pytest.mark.parametrize("owner, kind", [(None, ErrorKind.UNSUPPORTED), ("me", ErrorKind.CONFLICT), ("elsewhere:1:2", ErrorKind.CONFLICT)])
def test_a_session_whose_process_runs_or_is_unknown_is_refused(index, owner, kind):
    owner = owner_id() if owner == "me" else owner
    session = started(index, "owned", owner=owner)
    with pytest.raises(QuineboxError) as refused:
        _gone(index, resumable(index, session))
    assert (refused.value.kind, dict(refused.value.fields)) == (kind, {"session": session, **({"owner": owner} if owner else {})})
    assert refused.value.exit_code == 125 and "\n" not in str(refused.value)


def test_an_ended_a_pruned_a_missing_session_and_a_child_are_refused(index):
    ended = started(index, "ended")
    index.finish(ended, exit_code=1, termination="exit_failure", tokens=0, turns=1)
    pruned = started(index, "pruned")
    index.finish(pruned, exit_code=0, termination="exit_success", tokens=0, turns=1)
    index.forget([pruned], 1.0)
    root = started(index, "root")
    child = started(index, "child", parent=root)
    grandchild = started(index, "grandchild", parent=child)
    for session, kind, fields in (
        (ended, ErrorKind.CONFLICT, {"session": ended}),  # it has ended: nothing to resume
        (pruned, ErrorKind.NOT_FOUND, {"session": pruned, "pruned": pruned, "pruned_at": 1.0}),
        ("no-such-session", ErrorKind.NOT_FOUND, {"session": "no-such-session"}),
        (grandchild, ErrorKind.BAD_INPUT, {"session": grandchild, "root": root}),  # resume the root of its tree
    ):
        with pytest.raises(QuineboxError) as refused:
            resumable(index, session)
        assert (refused.value.kind, dict(refused.value.fields), refused.value.exit_code) == (kind, fields, 125)


def test_one_resume_at_a_time_and_a_lost_one_lets_go(index):
    session = started(index, "locked")
    held = _lock(session)
    with pytest.raises(QuineboxError) as refused:
        _lock(session)
    assert (refused.value.kind, dict(refused.value.fields)) == (ErrorKind.CONFLICT, {"session": session, "holder": owner_id()})
    os.close(held)  # as the kernel does for a process that dies
    os.close(_lock(session))


def test_bytes_of_material_are_cut(index):
    assert passed_over(b"l1\nl2\n", 3, "s") == b"l2\n"
    assert passed_over(b"", 0, "s") == b""
    with pytest.raises(QuineboxError) as short:
        passed_over(b"ab", 3, "s")
    assert (short.value.kind, dict(short.value.fields)) == (ErrorKind.BAD_INPUT, {"session": "s", "held": 2, "read": 3})


def test_a_file_is_read_on_from_where_the_session_was(tmp_path):
    material = tmp_path / "material"
    material.write_bytes(b"head\nl1\nl2\n")
    with open(material, "rb") as given:
        os.read(given.fileno(), 5)  # the caller had read some itself: the session's count starts where stdin did
        assert passed_over(given.fileno(), 3, "s") == given.fileno()
        assert os.read(given.fileno(), 100) == b"l2\n"
    with open(material, "rb") as given, pytest.raises(QuineboxError) as short:
        passed_over(given, 12, "s")
    assert (short.value.kind, dict(short.value.fields)) == (ErrorKind.BAD_INPUT, {"session": "s", "held": 11, "read": 12})


def test_a_pipe_is_read_and_dropped_as_far_as_the_session_had_read(tmp_path):
    r, w = os.pipe()
    os.write(w, b"l1\nl2\n")
    os.close(w)
    try:
        assert passed_over(r, 3, "s") == r
        assert os.read(r, 100) == b"l2\n"
    finally:
        os.close(r)
    r, w = os.pipe()
    os.write(w, b"l1")
    os.close(w)
    try:
        with pytest.raises(QuineboxError) as short:
            passed_over(r, 3, "s")
        assert (short.value.kind, short.value.held) == (ErrorKind.BAD_INPUT, 2)
    finally:
        os.close(r)


def test_no_material_given_where_some_was_read_is_refused():
    from quinebox.box.process import DEVNULL, PIPE

    main, terminal = os.openpty()
    try:
        for stdin in (DEVNULL, PIPE, print, terminal):  # a terminal would wait for a person to type it
            with pytest.raises(QuineboxError) as unread:
                passed_over(stdin, 3, "s")
            assert (unread.value.kind, dict(unread.value.fields)) == (ErrorKind.BAD_INPUT, {"session": "s", "read": 3})
    finally:
        os.close(main)
        os.close(terminal)
    assert passed_over(DEVNULL, 0, "s") == DEVNULL


def test_the_box_starts_again_as_it_was_under_its_own_id_and_world_its_time_less_what_it_ran(index):
    from quinebox.agent.records import Meta
    from quinebox.agent.resumption import Resumption
    from quinebox.tree.resume import _spec
    from quinebox.worlds.build import create
    from quinebox.worlds.spec import WorldSpec, world_dir

    session = started(index, "again")
    world = WorldSpec(kind="dir", layer=str(world_dir(session) / "tree"))
    create(session, world, os.getuid(), os.getgid())
    meta = Meta(t=1.0, session=session, mission="m", model="script:x", grants=["mem:256m", "spawn:2", "depth:1", "time:30s"],
                ask=["spawn:4"], deny=["net"], ask_timeout=0.0, runtime="runsc")
    row = index.get(session)
    assert row is not None
    spec = _spec(row, meta, Resumption(ran_for=12.0))
    assert (spec.session, spec.world, spec.runtime, spec.agent) == (session, world, "runsc", True)
    assert (spec.grants.time, spec.grants.spawn, spec.grants.mem) == (18.0, 2, 256 << 20)
    assert spec.asks.format() == {"ask": ["spawn:4"], "deny": ["net"]} and spec.asks.timeout == 0
    assert spec.lifeline is not None and spec.lifeline.endswith(f"{session}.sock")
    assert _spec(row, meta, Resumption(ran_for=99.0)).grants.time == 0.001  # spent: it ends as soon as it starts (124)

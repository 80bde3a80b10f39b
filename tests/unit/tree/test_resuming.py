"""`quinebox resume`'s refusals (one line, nothing started), its lock, and how it passes over the material the
session had read; the rest (a real run killed and resumed, on each backend) is e2e (tests/e2e/test_resume.py)."""

from __future__ import annotations

import os
import re
import socket

import pytest

from quinebox.agent.store import Index
from quinebox.errors import QuineboxError
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


@pytest.mark.parametrize("owner, words", [(None, "does not say which process ran it"), ("me", "is still running (process"), ("elsewhere:1:2", "on elsewhere")])
def test_a_session_whose_process_runs_or_is_unknown_is_refused(index, owner, words):
    session = started(index, "owned", owner=owner_id() if owner == "me" else owner)
    with pytest.raises(QuineboxError, match=re.escape(words)) as refused:
        _gone(index, resumable(index, session))
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
    for session, words in (
        (ended, "has ended (exit 1, exit_failure): there is nothing to resume"),
        (pruned, "was pruned at"),
        ("no-such-session", "no session 'no-such-session'"),
        (grandchild, f"is a child of {child}: resume the root of its tree ({root})"),
    ):
        with pytest.raises(QuineboxError, match=re.escape(words)) as refused:
            resumable(index, session)
        assert refused.value.exit_code == 125


def test_one_resume_at_a_time_and_a_lost_one_lets_go(index):
    session = started(index, "locked")
    held = _lock(session)
    with pytest.raises(QuineboxError, match=re.escape(f"is being resumed already (by {owner_id()})")):
        _lock(session)
    os.close(held)  # as the kernel does for a process that dies
    os.close(_lock(session))


def test_bytes_of_material_are_cut(index):
    assert passed_over(b"l1\nl2\n", 3, "s") == b"l2\n"
    assert passed_over(b"", 0, "s") == b""
    with pytest.raises(QuineboxError, match="holds 2 bytes, and session s had read 3 of it"):
        passed_over(b"ab", 3, "s")


def test_a_file_is_read_on_from_where_the_session_was(tmp_path):
    material = tmp_path / "material"
    material.write_bytes(b"head\nl1\nl2\n")
    with open(material, "rb") as given:
        os.read(given.fileno(), 5)  # the caller had read some itself: the session's count starts where stdin did
        assert passed_over(given.fileno(), 3, "s") == given.fileno()
        assert os.read(given.fileno(), 100) == b"l2\n"
    with open(material, "rb") as given, pytest.raises(QuineboxError, match="holds 11 bytes, and session s had read 12"):
        passed_over(given, 12, "s")


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
        with pytest.raises(QuineboxError, match="holds 2 bytes"):
            passed_over(r, 3, "s")
    finally:
        os.close(r)


def test_no_material_given_where_some_was_read_is_refused():
    from quinebox.box.process import DEVNULL, PIPE

    main, terminal = os.openpty()
    try:
        for stdin in (DEVNULL, PIPE, print, terminal):  # a terminal would wait for a person to type it
            with pytest.raises(QuineboxError, match="had read 3 bytes of its material: give the material again"):
                passed_over(stdin, 3, "s")
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

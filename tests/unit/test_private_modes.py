"""What a session writes is the user's alone, whatever the umask (quinebox/state.py): every dir 0700, every file
0600, an object of the store and a sealed audit segment 0400. Each test makes the real thing (a tape and the
index, a world revised into the object store, the audit log sealed into segments, a pending request and its
decision, a run's record) under a umask of 000, which leaves every bit the code asks for, and of 0277, which
takes even the owner's write bit, then walks the state dir and checks the mode of everything in it."""

import os
import stat
import threading
import time
from pathlib import Path

import pytest

from quinebox.agent.store import Index, Tape
from quinebox.audit import approvals
from quinebox.audit.approvals import Approver
from quinebox.audit.asks import Asks
from quinebox.audit.log import AuditLog
from quinebox.audit.request import Request
from quinebox.state import private_dir, private_file, private_write
from quinebox.tree.runs import RunRecord
from quinebox.worlds.build import create
from quinebox.worlds.spec import WorldSpec, world_dir
from quinebox.worlds.world import World

#: Files written once and never again.
SEALED = ("objects/??/*", "audit/segments/*")


@pytest.fixture(params=[0o000, 0o277], ids=["umask-000", "umask-277"])
def umask(request):
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


@pytest.fixture
def state(tmp_path, monkeypatch):
    path = tmp_path / "state"
    monkeypatch.setenv("QUINEBOX_STATE_DIR", str(path))
    return path


def modes(root: Path, *, besides: tuple[str, ...] = ()) -> dict[str, str]:
    """Each entry under `root` (not in `besides`, the worlds' own files) whose mode is not the one it must have:
    relative path → what it is; empty when all are right."""
    wrong = {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(top) / name
            relative = str(path.relative_to(root))
            if any(relative.startswith(inner + "/") for inner in besides):
                continue
            info = os.lstat(path)
            want = 0o700 if stat.S_ISDIR(info.st_mode) else 0o400 if any(path.match(str(root / p)) for p in SEALED) else 0o600
            if stat.S_IMODE(info.st_mode) != want:
                wrong[relative] = f"{stat.filemode(info.st_mode)} ({stat.S_IMODE(info.st_mode):04o}), not {want:04o}"
    return wrong


def test_the_helpers_set_the_mode_whatever_the_umask_and_leave_alone_what_was_there(tmp_path, umask):
    deep = tmp_path / "a" / "b" / "c"
    private_dir(deep)
    os.close(private_file(deep / "made", os.O_WRONLY | os.O_CREAT))
    private_write(deep / "whole", b"bytes")
    assert (deep / "whole").read_bytes() == b"bytes"
    assert modes(tmp_path / "a") == {}
    (deep / "sealed").write_bytes(b"")
    os.chmod(deep / "sealed", 0o400)
    os.close(private_file(deep / "sealed", os.O_RDONLY | os.O_CREAT))
    assert stat.S_IMODE((deep / "sealed").stat().st_mode) == 0o400  # opened, not made: its mode stays
    with pytest.raises(FileExistsError):
        private_file(deep / "made", os.O_WRONLY | os.O_CREAT | os.O_EXCL)


def test_a_tape_its_session_dir_and_the_index_are_the_users_alone(state, umask):
    tape = Tape("s-modes")
    tape.append("meta", mission="the secret mission")
    tape.close()
    index = Index()
    index.start("s-modes", parent=None, mission="the secret mission", model="script")
    assert {p.name for p in state.iterdir()} >= {"sessions", "sessions.db", "sessions.db-wal", "sessions.db-shm", "sessions.db.lock"}
    index.close()
    assert modes(state) == {}


def test_a_world_its_revisions_and_its_objects_are_the_users_alone(state, tmp_path, umask):
    host = tmp_path / "host"
    host.mkdir()
    host.chmod(0o700)  # the test's own, made under its umask
    (host / "notes.txt").write_text("mine\n")
    session = "s-world-modes"
    spec = WorldSpec(kind="dir", layer=str(world_dir(session) / "tree"), sources=(str(host / "notes.txt"),))
    create(session, spec, os.getuid(), os.getgid())
    world = World(session, spec)
    try:
        Path(spec.layer, "made.txt").write_text("made in the world\n")
        assert world.revise("sh", turn=1) is not None
    finally:
        world.close()
    child = WorldSpec(kind="overlay", layer=str(world_dir("s-child-modes") / "upper"), work=str(world_dir("s-child-modes") / "work"), lowers=(spec.layer,), base=(session, world.rev))
    create("s-child-modes", child, os.getuid(), os.getgid())
    assert len(list((state / "objects").glob("??/*"))) == 2
    layers = (f"sessions/{session}/world/tree", "sessions/s-child-modes/world/upper", "sessions/s-child-modes/world/work")
    assert modes(state, besides=layers) == {}


def test_the_audit_log_its_head_and_its_sealed_segments_are_the_users_alone(state, monkeypatch, umask):
    monkeypatch.setenv("QUINEBOX_AUDIT_SEGMENT", "1000")
    log = AuditLog(state / "audit")
    for index in range(20):
        log.append("box_created", f"s{index}", index=index)
    assert len(list(log.segments.iterdir())) > 2
    assert modes(state) == {}


def test_a_pending_request_its_decision_and_the_remembered_rules_are_the_users_alone(state, monkeypatch, umask):
    monkeypatch.setattr(approvals, "POLL_S", 1.0)  # the asker looks for a decision once a second: time to see its file
    asked = Request("s-ask", "egress", "net:example.com:443", {"host": "example.com", "port": 443})
    who = Approver(Asks.parse(["net:*"], (), "60", cwd="/srv/project"), terminal=False)
    decided = []
    thread = threading.Thread(target=lambda: decided.append(who.decide(asked)), daemon=True)
    thread.start()
    pending = state / "audit" / "pending" / f"{asked.id}.json"
    until = time.monotonic() + 10
    while not pending.exists() and time.monotonic() < until:
        time.sleep(0.01)
    assert pending.exists()
    approvals.decide(asked.id, allow=True, scope="always")
    assert (state / "audit" / "decided" / f"{asked.id}.json").exists()
    assert modes(state) == {}
    thread.join(10)
    assert decided and decided[0].scope == "always"
    assert (state / "audit" / "remembered.json").exists()
    assert modes(state) == {}


def test_a_runs_record_is_the_users_alone(state, tmp_path, umask):
    class Job:
        name, source = "one", "one.txt"

    run = RunRecord("map", "the secret mission", tmp_path / "out")
    run.begin([Job()], resumed=())
    run.attempt("one", "one.txt", "s-run")
    run.end(0)
    assert {p.name for p in (state / "runs" / run.id).iterdir()} == {"run.json", "attempts.jsonl", "end.json"}
    assert modes(state) == {}

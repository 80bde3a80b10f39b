"""A bwrap box as listed (backends/bwrap/listed.py) from records written here into a state dir of the test's own:
its state from its PID 1's pid AND start time (a reused pid is never it, nor ever signalled), its user and cwd, what
it cannot do in one line each, and a record that is gone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from quinebox.box.backends.boxes import Lacking
from quinebox.box.policy import LABEL_OWNER, LABEL_SESSION
from quinebox.errors import EngineError
from quinebox.processes import owner_id, process_start_ticks


@pytest.fixture()
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A state dir of this test's alone: the session's own must hold no bwrap record at its end (tests/conftest.py)."""
    monkeypatch.setenv("QUINEBOX_STATE_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture()
def sleeper():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def record(state: Path, session: str, *, pid: int | None, start: str | None, holder: int | None = None, cgroup: str = "") -> dict:
    from quinebox.box.backends.bwrap.box import records_dir

    cid = f"quinebox-{session}"
    made = {
        "id": cid, "session": session, "labels": {LABEL_SESSION: session, LABEL_OWNER: owner_id()}, "pid": pid, "start": start,
        "holder_pid": holder, "cgroup": cgroup, "image_root": "/img/abc/rootfs", "made": time.time(), "command": ["sh", "-c", "sleep 9"],
        "user": "1000:1000", "cwd": "/work", "host_ids": [100000, 100000], "ids": None,
    }
    directory = records_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{cid}.json"
    path.write_text(json.dumps(made))
    path.chmod(0o600)
    return made


def listed(session: str):
    from quinebox.box.backends.bwrap.listed import bwrap_boxes

    return next(box for box in bwrap_boxes() if box.session == session)


def test_a_running_box_is_listed_from_its_record(state, sleeper):
    record(state, "run1", pid=sleeper.pid, start=process_start_ticks(sleeper.pid))
    box = listed("run1")
    assert (box.id, box.backend, box.state, box.command, box.image_root) == ("quinebox-run1", "bwrap", "running", "sh -c sleep 9", "/img/abc/rootfs")
    assert box.owner == owner_id()
    assert box.process() == ("1000:1000", "/work")
    assert box.capabilities.pause and box.capabilities.host_processes and not box.capabilities.checkpoint
    assert box.id_ranges() is None


def test_a_reused_pid_is_a_dead_box_and_is_never_signalled(state, sleeper):
    """The record's pid runs, but started at another time: another process the kernel gave that pid to."""
    record(state, "reused", pid=sleeper.pid, start="1")
    box = listed("reused")
    assert box.state == "exited"
    assert box.kill() and box.kill("TERM")
    time.sleep(0.05)
    assert sleeper.poll() is None  # the stranger lives on
    with pytest.raises(EngineError, match="going away"):
        box.freeze()


def test_kill_ends_the_box_pid_1(state, sleeper):
    record(state, "k", pid=sleeper.pid, start=process_start_ticks(sleeper.pid), cgroup="/quinebox-not-made-here")
    assert listed("k").kill("TERM")
    assert sleeper.wait(10) == -signal.SIGTERM
    assert listed("k").state == "exited"


def test_sigkill_ends_it_where_its_cgroup_is_not_there(state, sleeper):
    record(state, "k9", pid=sleeper.pid, start=process_start_ticks(sleeper.pid), cgroup="/quinebox-not-made-here")
    assert listed("k9").kill()
    assert sleeper.wait(10) == -signal.SIGKILL


def test_a_box_being_made_is_created_until_its_holder_goes(state, sleeper):
    record(state, "mk", pid=None, start=None, holder=sleeper.pid)
    assert listed("mk").state == "created"
    sleeper.kill()
    sleeper.wait()
    assert listed("mk").state == "exited"


def test_what_it_cannot_do_is_one_line_each(state, sleeper):
    record(state, "w", pid=sleeper.pid, start=process_start_ticks(sleeper.pid))
    box = listed("w")
    with pytest.raises(Lacking) as lacked:
        box.exec_way("w", tty=True, guard=False)
    assert str(lacked.value) == ("box w: bwrap enters no running box: a command reaches it through its init only, asked by the box's holder "
                                 "(`quinebox exec --in` asks it), with no terminal and as the box's own user; a box to enter: start it with --backend oci")
    with pytest.raises(Lacking, match="^box w: bwrap has no checkpoint and restore"):
        box.checkpoint("img", (0, 1, 2), lambda: None)
    assert "\n" not in box.why_not("own_user_namespace") and "1000:1000" in box.why_not("own_user_namespace")


def test_a_root_exec_is_refused_in_one_line(state, sleeper):
    from quinebox.box.live.execs import Target
    from quinebox.box.live.sandboxes import user_of
    from quinebox.errors import GrantError

    record(state, "r", pid=sleeper.pid, start=process_start_ticks(sleeper.pid))
    box = listed("r")
    with pytest.raises(GrantError, match="refused user '0'.*maps the box's own user"):
        user_of(Target("r", box, "1000:1000", "/"), "0")


def test_a_box_whose_record_went_is_gone(state):
    from quinebox.box.backends.bwrap.listed import listed_bwrap

    with pytest.raises(EngineError, match="^box s1 is gone"):
        listed_bwrap("quinebox-s1", {LABEL_SESSION: "s1"})


def test_no_records_no_boxes(state):
    from quinebox.box.backends.bwrap.listed import bwrap_boxes

    assert bwrap_boxes() == []
    assert os.listdir(state) == [] or "bwrap" not in os.listdir(state)

"""bwrap boxes as whoever lists them sees them (backends/bwrap/listed.py), on the real bwrap, cgroups and processes:
`quinebox ps` shows a running one, `kill` ends it, and what is left on the host once its holder is killed by SIGKILL
(the box's record, its cgroups in every hierarchy, its processes) goes by the keeper, or by `quinebox gc` when the
keeper went too; a lasting box (`box create --backend bwrap`) runs `exec --in` by its init, is paused by its own cgroup's
freezer (seen from the host) and resumed, refuses an exec as root in one line, and `box rm` leaves nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from commands import QUINEBOX, qb, wait_for
from live_boxes import cgroups_of

import quinebox
from quinebox.processes import pid_alive
from quinebox.state import state_dir


@pytest.fixture
def bwrap(monkeypatch, engine):
    """Boxes on bwrap; the engine (none in the rootless pass) unpacks the agent image the first time only."""
    monkeypatch.setenv("QUINEBOX_BACKEND", "bwrap")
    monkeypatch.delenv("QUINEBOX_RUNTIME", raising=False)
    assert quinebox.exec(["true"]).returncode == 0


def records() -> dict[str, dict]:
    """The bwrap records of this session's state dir, by session."""
    found = {}
    for path in (state_dir() / "bwrap").glob("*.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        found[record["session"]] = record
    return found


def remains(session: str, record: dict) -> list[str]:
    """What of the box is left on the host: its record, its cgroups (any hierarchy), its PID 1, any process in its cgroup."""
    left = [f"record {session}"] if session in records() else []
    left += cgroups_of(session)
    if record.get("pid") and pid_alive(int(record["pid"]), str(record["start"])):
        left.append(f"process {record['pid']}")
    return left + processes_naming(session)


def processes_naming(session: str) -> list[str]:
    """Processes on the host whose command line or cgroup names the box (bwrap's own argv binds its session's paths)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            seen = Path(f"/proc/{pid}/cmdline").read_bytes() + Path(f"/proc/{pid}/cgroup").read_bytes()
            state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state == b"Z":  # exited, holding nothing: an orphan the host's own init has yet to reap (its pace, not ours)
            continue
        if session.encode() in seen and int(pid) != os.getpid():
            found.append(f"process {pid}: {seen[:120]!r}")
    return found


def gone(session: str, record: dict, within: float) -> list[str]:
    until = time.monotonic() + within
    while (left := remains(session, record)) and time.monotonic() < until:
        time.sleep(0.02)
    return left


def sleeper() -> tuple[subprocess.Popen, str, dict]:
    """A `quinebox exec --backend bwrap -- sleep 300` of its own, its box's session and completed record once it runs."""
    proc = subprocess.Popen([QUINEBOX, "exec", "--backend", "bwrap", "--", "sleep", "300"], stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        session, record = wait_for(
            lambda: next(((s, r) for s, r in records().items() if r.get("pid") and "sleep 300" in " ".join(r.get("command") or [])
                          and r.get("holder_pid") in (proc.pid, *_children(proc.pid))), None),
            timeout=30, every=0.02, what="the bwrap box's record",
        )
    except AssertionError:
        proc.kill()
        proc.wait()
        raise
    return proc, session, record


def _children(pid: int) -> list[int]:
    """The children of `pid` (the holder may be the CLI itself or a process it started)."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def test_ps_lists_a_running_bwrap_box_and_kill_ends_it(bwrap):
    proc, session, record = sleeper()
    try:
        listed = qb("ps")
        assert listed.returncode == 0, listed.stderr
        row = next(line for line in listed.stdout.decode().splitlines() if session in line)
        assert "sleep 300" in row and "running" in row
        assert cgroups_of(session)
        killed = qb("kill", session)
        assert (killed.returncode, killed.stderr) == (0, f"quinebox: killed 1 box: {session}\n".encode())
        assert proc.wait(30) == 137
    finally:
        proc.kill()
        proc.wait()
    assert gone(session, record, 2.0) == []


def test_sigkill_of_the_holder_leaves_nothing_after_the_keeper(bwrap):
    proc, session, record = sleeper()
    assert cgroups_of(session) and len(processes_naming(session)) >= 2  # bwrap and the box's PID 1, at least
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert gone(session, record, 3.0) == []


def test_gc_removes_what_a_holder_and_its_keeper_left(bwrap):
    """Holder and keeper both killed (as after a crash): the box died with its holder (--die-with-parent); its record
    and cgroups are left, `ps` shows it exited, and `quinebox gc` removes them."""
    proc, session, record = sleeper()
    keepers = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _keeper_of(p, proc.pid)]
    assert len(keepers) == 1
    os.kill(keepers[0], signal.SIGKILL)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    wait_for(lambda: not pid_alive(int(record["pid"]), str(record["start"])), timeout=5, what="the box's end with its holder")
    assert session in records() and cgroups_of(session)  # nobody was left to take them
    row = next(line for line in qb("ps").stdout.decode().splitlines() if session in line)
    assert "exited" in row
    done = qb("gc")
    assert done.returncode == 0, done.stderr
    said = next(line for line in done.stderr.decode().splitlines() if line.startswith("quinebox: removed ") and "orphaned box" in line)
    assert session in said.split(": ", 2)[2].split()  # among what gc removed (an earlier test's orphan may be there too)
    assert gone(session, record, 0.5) == []


def _keeper_of(proc: Path, owner: int) -> bool:
    """Whether /proc/PID is a keeper `owner` forked (named so, its parent the owner)."""
    try:
        stat = (proc / "stat").read_text()
    except OSError:
        return False
    name, _, rest = stat.partition(") ")
    return name.endswith("(quinebox-keeper") and int(rest.split()[1]) == owner


def freezer_state(record: dict) -> str:
    """The box's own cgroup's freezer as the host reads it (v1's freezer.state, else v2's cgroup.events)."""
    rel = str(record["cgroup"]).strip("/")
    for v1 in (Path("/sys/fs/cgroup/freezer") / rel / "freezer.state",):
        if v1.exists():
            return v1.read_text().strip()
    events = next(p for p in (Path("/sys/fs/cgroup/unified") / rel / "cgroup.events", Path("/sys/fs/cgroup") / rel / "cgroup.events") if p.exists())
    return "FROZEN" if "frozen 1" in events.read_text() else "THAWED"


def test_a_lasting_bwrap_box_execs_by_its_init_pauses_and_goes(bwrap):
    made = qb("box", "create", "--backend", "bwrap", timeout=60)
    assert made.returncode == 0, made.stderr
    session = made.stdout.decode().strip()
    try:
        record = records()[session]
        ran = qb("exec", "--in", session, "--", "sh", "-c", "echo in; cat; exit 3", input=b"piped")
        assert (ran.returncode, ran.stdout, ran.stderr) == (3, b"in\npiped", b"")
        data = os.urandom(1 << 16)  # cp in and out: handed to the box's holder, as exec --in is (bwrap has no exec of its own)
        put = qb("cp", "-", f"{session}:/tmp/blob", input=data)
        assert put.returncode == 0, put.stderr
        took = qb("cp", f"{session}:/tmp/blob", "-")
        assert (took.returncode, took.stdout) == (0, data), took.stderr
        root = qb("exec", "--in", session, "--user", "0", "--", "id")
        assert root.returncode == 125 and root.stderr.count(b"\n") == 1 and b"maps the box's own user" in root.stderr, root.stderr
        paused = qb("box", "pause", session)
        assert paused.returncode == 0, paused.stderr
        assert freezer_state(record) == "FROZEN"
        refused = qb("exec", "--in", session, "--", "true")
        assert refused.returncode == 125 and b"is paused" in refused.stderr
        resumed = qb("box", "resume", session)
        assert resumed.returncode == 0, resumed.stderr
        assert freezer_state(record) == "THAWED"
        assert qb("exec", "--in", session, "--", "echo", "again").stdout == b"again\n"
        assert qb("box", "pause", session).returncode == 0  # removed while paused: its kill thaws it first
    finally:
        removed = qb("box", "rm", session)
    assert (removed.returncode, removed.stdout) == (0, f"{session}\n".encode()), removed.stderr
    assert gone(session, record, 2.0) == []


def test_a_sandbox_on_bwrap_execs_by_its_init_and_pauses(bwrap):
    """In-process: the Sandbox holds the box's lifeline, so its execs are its init's forks (each in a pids cgroup of
    its own below the box's); pause stops them where they are, as the host's freezer says."""
    with quinebox.Sandbox(backend="bwrap") as sb:
        record = records()[sb.id]
        ran = sb.exec(["sh", "-c", "grep -E '^(NoNewPrivs|Seccomp|CapEff):' /proc/self/status; id -u"])
        uid = record["user"].split(":")[0]
        assert (ran.returncode, ran.stdout) == (0, f"CapEff:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\n{uid}\n".encode()), ran.stderr
        slow = sb.Popen(["sleep", "30"])
        sb.pause()
        assert freezer_state(record) == "FROZEN" and sb.paused
        sb.resume()
        assert freezer_state(record) == "THAWED"
        slow.kill()
        assert slow.wait(10) == 137
    assert gone(sb.id, record, 2.0) == []

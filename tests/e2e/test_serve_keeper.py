"""The boxes' keeper of a command server (box/backends/keeper.py), on real servers, workers, boxes and runtimes: the
server forks one keeper before any worker, and its workers tell it of their boxes instead of forking one each; a
worker killed by SIGKILL while its box runs leaves nothing once that keeper has swept, and the server goes on serving.

Each backend pins itself (the Docker pass runs tests/e2e on the engine, which has no keeper)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from commands import QUINEBOX, wait_for
from live_boxes import cgroups_of, local_boxes

from quinebox.box.backends import keeper
from quinebox.box.policy import LABEL_SESSION

BACKENDS = ["bwrap", "oci"]


@pytest.fixture(params=BACKENDS)
def served(request, tmp_path, engine):
    """A server with no pool on a state dir of its own, its boxes on the backend; (its environment, its pid)."""
    env = {**os.environ, "QUINEBOX_STATE_DIR": str(tmp_path / "state"), "QUINEBOX_SERVE": "manual", "QUINEBOX_BACKEND": request.param}
    env.pop("QUINEBOX_RUNTIME", None)
    started = subprocess.run([QUINEBOX, "serve", "--background", "--pool", "0"], env=env, capture_output=True, timeout=60)
    assert started.returncode == 0, started.stderr
    server = _server_of(env)
    assert subprocess.run([QUINEBOX, "exec", "--", "true"], env=env, capture_output=True, timeout=120).returncode == 0  # the image unpacked
    yield env, server
    subprocess.run([QUINEBOX, "serve", "stop"], env=env, capture_output=True, timeout=60)


def status(env: dict) -> dict:
    """What `serve status --json` says of the server of `env`."""
    said = subprocess.run([QUINEBOX, "serve", "status", "--json"], env=env, capture_output=True, timeout=60)
    assert said.returncode == 0, said.stderr
    return json.loads(said.stdout)


def _server_of(env: dict) -> int:
    return int(status(env)["pid"])


def _stat(pid: int) -> tuple[str, int] | None:
    """(comm, ppid) of a running process; None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name, _, rest = text.rpartition(") ")
    return name.partition("(")[2], int(rest.split()[1])


def descendants(root: int) -> dict[int, str]:
    """Every process below `root` (by parent pid, as /proc says now): pid -> comm."""
    table = {int(p): s for p in os.listdir("/proc") if p.isdigit() and (s := _stat(int(p))) is not None}
    found: dict[int, str] = {}
    frontier = {root}
    while frontier:
        frontier = {pid for pid, (_, parent) in table.items() if parent in frontier and pid not in found}
        found.update({pid: table[pid][0] for pid in frontier})
    return found


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def keepers(server: int) -> list[int]:
    return sorted(pid for pid, comm in descendants(server).items() if comm == keeper.NAME.decode())


def sleepers(env: dict, count: int) -> list[subprocess.Popen]:
    """`count` served `exec`s of `sleep`, each with its box running (it said so)."""
    procs = [subprocess.Popen([QUINEBOX, "exec", "--", "sh", "-c", "echo started; exec sleep 300"], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
             for _ in range(count)]
    for proc in procs:
        assert proc.stdout.readline() == b"started\n"
    return procs


def test_served_execs_fork_no_keeper(served):
    """The server's one keeper, its own child, forked before its first worker: three boxes running at once in three
    workers, and after ten more execs, it is still the only keeper in the server's tree (each worker forked one)."""
    env, server = served
    [own] = keepers(server)
    assert _stat(own)[1] == server
    procs = sleepers(env, 3)
    try:
        assert keepers(server) == [own]
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    for _ in range(10):
        assert subprocess.run([QUINEBOX, "exec", "--", "true"], env=env, capture_output=True, timeout=120).returncode == 0
    assert keepers(server) == [own]


def remains(env: dict, session: str) -> list[str]:
    """What of a box is left on the host: its runtime's listing, its bundle, its bwrap record, its cgroups (its
    lifeline's socket is gc's, as after any holder's SIGKILL)."""
    state = Path(env["QUINEBOX_STATE_DIR"])
    mine = os.environ["QUINEBOX_STATE_DIR"]
    os.environ["QUINEBOX_STATE_DIR"] = env["QUINEBOX_STATE_DIR"]
    try:
        left = [f"box {box['Id']}" for box in local_boxes() if box["Labels"][LABEL_SESSION] == session]
    finally:
        os.environ["QUINEBOX_STATE_DIR"] = mine
    left += [f"bundle {path.name}" for path in (state / "run").glob(f"{session}.oci")]
    left += [f"record {path.name}" for path in (state / "bwrap").glob("*.json") if session in path.read_text()]
    return left + cgroups_of(session)


def test_a_worker_killed_while_its_box_runs_leaves_nothing_and_the_server_serves_on(served):
    env, server = served
    [own] = keepers(server)
    [proc] = sleepers(env, 1)
    box = wait_for(lambda: next((pid for pid in descendants(server) if _cmdline(pid) == b"sleep\x00300\x00"), None), timeout=30,
                   what="the box's sleep")  # its shell said "started" and is exec'ing it
    worker = box
    while (stat := _stat(worker)) is not None and stat[1] != server:
        worker = stat[1]
    assert worker not in (own, server, 1) and _stat(worker) is not None
    session = _session_of(box)
    assert remains(env, session)
    os.kill(worker, signal.SIGKILL)
    proc.wait(30)
    with contextlib.suppress(AssertionError):
        wait_for(lambda: not remains(env, session), timeout=10)
    assert remains(env, session) == []  # the server's keeper swept them, the server still up
    assert _stat(box) is None
    done = subprocess.run([QUINEBOX, "exec", "--", "echo", "served"], env=env, capture_output=True, timeout=120)
    assert (done.returncode, done.stdout) == (0, b"served\n"), done.stderr
    assert keepers(server) == [own]


def _session_of(box: int) -> str:
    """The session of the box whose process is `box`: the one cgroup named for a box it is in."""
    for line in Path(f"/proc/{box}/cgroup").read_text().splitlines():
        for part in line.split(":", 2)[2].split("/"):
            if part.startswith("quinebox-"):
                return part.removeprefix("quinebox-")
    raise AssertionError(f"process {box} is in no box's cgroup")

"""Nothing a command server starts outlives what it serves: a short job starts no warm pool, a server exits once its
state dir is removed (and takes its pool's boxes with it), and a pytest session stops the servers its tests started.

Each test has a state dir of its own, below a dir it removes as a CI job does, with QUINEBOX_SERVE=auto; every
server a test starts is ended by its pid at the end, whatever happened. Each waits on processes' exits (pidfds).
"""

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest
from commands import QUINEBOX, wait_for

from quinebox.box.policy import LABEL_OWNER
from quinebox.box.shape import LABEL_POOL


def quinebox(*args, env, **options):
    return subprocess.run([QUINEBOX, *args], env=env, capture_output=True, timeout=120, **options)


def status(env) -> dict | None:
    said = quinebox("serve", "status", "--json", env={**env, "QUINEBOX_SERVE": "manual"})
    return json.loads(said.stdout) if said.returncode == 0 else None


def exited(pids: list[int], within: float) -> list[int]:
    """Of `pids`, those still running after waiting up to `within` seconds for each to exit (its pidfd readable)."""
    held = {}
    for pid in pids:
        try:
            held[pid] = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
    try:
        waiting = dict(held)
        for pid, fd in held.items():
            if select.select([fd], [], [], within)[0]:
                waiting.pop(pid)
        return sorted(waiting)
    finally:
        for fd in held.values():
            os.close(fd)


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as listed:
            return [int(child) for child in listed.read().split()]
    except OSError:
        return []


@pytest.fixture
def job(tmp_path):
    """A CI job's temporary dir holding its state dir, and the environment that uses it; its servers ended by pid."""
    work = tmp_path / "job"
    (tmp_path / "config" / "quinebox").mkdir(parents=True)
    env = {**os.environ, "QUINEBOX_STATE_DIR": str(work / "state"), "XDG_CONFIG_HOME": str(tmp_path / "config"), "QUINEBOX_SERVE": "auto"}
    env.pop("QUINEBOX_POOL", None)
    seen: set[int] = set()
    yield work, env, seen
    answer = status(env) if work.exists() else None
    if answer:
        seen.add(answer["pid"])
    for pid in seen:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    assert exited(sorted(seen), 60) == []


def test_a_short_job_starts_no_warm_pool_and_commands_that_keep_coming_do(job):
    """The pool's boxes would outlive a short job by the pool's ttl, and keep its server up: it starts at the
    server's third command within a minute (a state dir's fourth: its first ran in-process and started the server)."""
    _, env, seen = job
    assert quinebox("exec", "--", "true", env=env).returncode == 0
    answer = wait_for(lambda: status(env), what="the server the first command started")
    seen.add(answer["pid"])
    for _ in range(2):
        assert quinebox("exec", "--", "true", env=env).returncode == 0
    answer = status(env)
    assert (answer["served"], answer["pool"], answer["pool_after"]) == (2, None, 3)
    said = quinebox("serve", "status", env=env).stdout.decode()
    assert "pool: not started: it starts once the server has run 3 commands within a minute" in said
    assert quinebox("exec", "--", "true", env=env).returncode == 0  # the third through it: commands keep coming
    wait_for(lambda: (status(env) or {}).get("pool"), what="the pool started")
    assert status(env)["pool_after"] is None


def test_a_server_exits_once_its_state_dir_is_removed_and_its_pools_boxes_go_with_it(job, engine):
    """`rm -rf` of a job's dir while its server's pool holds warm boxes (their mounts keep the removed directories'
    inodes, so the kernel says nothing of the dirs themselves until those boxes are gone): the server sees its
    socket go, and exits; its keeper lets every warm box go."""
    work, env, seen = job
    if env.get("QUINEBOX_BACKEND", "auto") == "auto":  # bwrap, auto's choice where usable, keeps no box warm: runc's pool here
        env["QUINEBOX_BACKEND"] = "oci"
    for _ in range(5):
        assert quinebox("exec", "--", "true", env=env).returncode == 0
        answer = wait_for(lambda: status(env), what="a server answering")
        seen.add(answer["pid"])
    wait_for(lambda: sum(shape["warm"] for shape in (status(env).get("pool") or {}).get("shapes", [])) >= 1, what="a warm box")
    answer = status(env)
    keeper = answer["pool"]["pid"]
    boxes = children(keeper)  # a runtime's warm boxes' inits are its keeper's children
    engine_boxes = engine.api.containers(filters={"label": LABEL_POOL}) if engine is not None else []
    engine_boxes = [box["Id"] for box in engine_boxes if box["Labels"][LABEL_OWNER].split(":")[1] == str(keeper)]
    assert boxes or engine_boxes
    subprocess.run(["rm", "-rf", str(work)], timeout=60)  # as a CI job's cleanup does: nothing stops the server first
    assert exited([answer["pid"]], 60) == [], "the server outlived its state dir"
    assert exited([keeper, *boxes], 30) == []  # the server waits for its keeper; the keeper lets its boxes go
    if engine_boxes:
        wait_for(lambda: not engine.api.containers(all=True, filters={"label": LABEL_POOL, "id": engine_boxes[0]}), what="the engine's warm boxes gone", timeout=60)
    shutil.rmtree(work, ignore_errors=True)  # what a make under way as it went may have put back (an empty runtime dir)


SUITE = '''
import json, os, subprocess, sys, time

QUINEBOX = os.path.join(os.path.dirname(sys.executable), "quinebox")

def test_runs_the_cli_in_a_state_dir_of_its_own(tmp_path):
    env = {**os.environ, "QUINEBOX_STATE_DIR": str(tmp_path / "s"), "QUINEBOX_SERVE": "auto"}
    for _ in range(2):
        assert subprocess.run([QUINEBOX, "exec", "--", "true"], env=env, timeout=120).returncode == 0
    until = time.monotonic() + 60
    while (said := subprocess.run([QUINEBOX, "serve", "status", "--json"], env=env, capture_output=True, timeout=60)).returncode != 0:
        assert time.monotonic() < until
        time.sleep(0.2)
    with open(os.environ["SERVER_PID_FILE"], "w") as out:
        out.write(str(json.loads(said.stdout)["pid"]))
'''


def test_a_pytest_session_stops_the_servers_its_tests_started(tmp_path):
    """A test suite that runs the CLI with a state dir per test starts a server per state dir; the plugin stops
    each as the session ends (pytest keeps its temporary dirs: nothing else would end them for 15 minutes)."""
    (tmp_path / "test_theirs.py").write_text(SUITE)
    env = {k: v for k, v in os.environ.items() if k not in ("QUINEBOX_PYTEST_SESSION", "QUINEBOX_SERVE")}
    env["SERVER_PID_FILE"] = str(tmp_path / "server.pid")
    theirs = tempfile.mkdtemp(prefix="qbp-")  # short: a Unix socket's path is at most 107 bytes
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp", theirs, str(tmp_path / "test_theirs.py")],
                              capture_output=True, env=env, cwd=tmp_path, timeout=300)
        assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
        pid = int((tmp_path / "server.pid").read_text())
        try:
            assert exited([pid], 30) == [], "the session's server outlived it"
        finally:
            if exited([pid], 0):
                os.kill(pid, signal.SIGTERM)
    finally:
        shutil.rmtree(theirs, ignore_errors=True)

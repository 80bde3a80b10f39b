"""A command server's workers used again (cli/workers.py), on real servers, boxes and runtimes: a worker whose exec
left it clean runs the next command, holding nothing of its last client's meanwhile (stdio, cwd, terminal); one whose
command died of a signal exits. Each backend pins itself, as in test_serve_keeper.py."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from commands import QUINEBOX, wait_for
from test_serve_keeper import _cmdline, _stat, descendants, served, status  # noqa: F401 (a fixture, its tests' argument)


def _worker_of(server: int, marker: str) -> int:
    """The server's child that runs the command whose argv holds `marker` (its box's process, walked up)."""
    box = wait_for(lambda: next((pid for pid in descendants(server) if marker.encode() in _cmdline(pid)), None), timeout=30, what=f"a box's process of {marker}")
    pid = box
    while (stat := _stat(pid)) is not None and stat[1] != server:
        pid = stat[1]
    assert stat is not None and pid not in (box, 1), f"{marker}'s box is not under the server {server}"
    return pid


def _exited(pid: int, server: int) -> bool:
    """Gone, or a zombie the server has not collected yet, or another process by now."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    fields = text.rpartition(") ")[2].split()
    return fields[0] in ("Z", "X") or int(fields[1]) != server


def _one(env: dict, cwd: Path, marker: str, server: int) -> tuple[int, bytes, set[str]]:
    """A served exec reading a line from its stdin (a pipe) with its stdout a pipe: (its worker, what it wrote, read
    to the end: a worker that kept the pipe would hold that end off; the pipes its stdio were)."""
    proc = subprocess.Popen([QUINEBOX, "exec", "-i", "--", "sh", "-c", 'echo started; read line; echo "got $line"', marker],
                            env=env, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline() == b"started\n"
    worker = _worker_of(server, marker)
    pipes = {os.readlink(f"/proc/self/fd/{f.fileno()}") for f in (proc.stdin, proc.stdout, proc.stderr)}
    out, err = proc.communicate(b"hello\n", timeout=60)
    assert proc.returncode == 0, err
    return worker, out, pipes


def test_a_worker_whose_exec_left_it_clean_runs_the_next_and_holds_nothing_of_its_client_meanwhile(served, tmp_path):  # noqa: F811
    env, server = served
    first, out, pipes = _one(env, tmp_path, "first-of-two", server)
    assert out == b"got hello\n"
    # free now: alive, in no client's directory, and with none of its descriptors (stdio included) a client's
    held = wait_for(lambda: (cwd := os.readlink(f"/proc/{first}/cwd")) == "/" and cwd, timeout=30, what="the worker let go of the client's cwd")
    assert held == "/"
    links = {fd: os.readlink(f"/proc/{first}/fd/{fd}") for fd in os.listdir(f"/proc/{first}/fd")}
    assert [links[str(fd)] for fd in (0, 1, 2)] == ["/dev/null"] * 3
    assert not pipes & set(links.values()), links
    wait_for(lambda: first in status(env)["workers"]["free"], timeout=30, what=f"the server to hear its worker {first} is free")
    second, out, _ = _one(env, tmp_path, "second-of-two", server)
    assert (second, out) == (first, b"got hello\n")


def test_a_worker_whose_command_died_of_a_signal_exits(served, tmp_path):  # noqa: F811
    env, server = served
    proc = subprocess.Popen([QUINEBOX, "exec", "--", "sh", "-c", "echo started; exec sleep 300", "killed-one"],
                            env=env, cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b"started\n"
    worker = _worker_of(server, "killed-one")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 128 + signal.SIGTERM
    wait_for(lambda: _exited(worker, server), timeout=30, what=f"the worker {worker} to exit")
    assert subprocess.run([QUINEBOX, "exec", "--", "true"], env=env, capture_output=True, timeout=120).returncode == 0

"""A box's init whose command dies of SIGKILL tells the host and waits for its word before it exits (guest/init.py's
`killed`): the host reads the box's memory cgroup while the box still stands, since the Docker engine's own `oom`
event can be lost. Run as a box runs it (`-I -S`, the guest's directory flat) against the host's real Broker on a
real Unix socket."""

import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from quinebox.box.backends.exec_cgroups import cgroup_of
from quinebox.box.net.broker import Broker
from quinebox.guest import protocol
from quinebox.resources import guest_dir

RUN = """
import sys
sys.path.insert(0, {guest!r})
import init
init.HOST_SOCKET = {sock!r}
init.KILLED_WAIT = {wait!r}
init.run(["--", "sh", "-c", {command!r}])
"""


def init(sock: str, command: str, wait: float = 2.0) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-I", "-S", "-c", RUN.format(guest=str(guest_dir()), sock=sock, command=command, wait=wait)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={"PATH": os.environ["PATH"]})


def test_the_init_says_its_command_was_killed_and_exits_only_once_the_host_has_looked(tmp_path):
    path = str(tmp_path / "host.sock")
    broker = Broker(path)
    told: list[tuple[int, bool, str]] = []
    looked = threading.Event()

    def killed(pid: int) -> None:
        time.sleep(0.3)  # the host looks slowly: the init must still stand when it has looked
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rpartition(")")[2].split()[0]
        told.append((pid, state != "Z", cgroup_of(pid, "memory")))
        looked.set()

    broker.killed = killed
    try:
        started = time.monotonic()
        box = init(path, "kill -9 $$", wait=60.0)
        out, err = box.communicate(timeout=30)
        took = time.monotonic() - started
    finally:
        broker.close()
    assert (box.returncode, out, err) == (137, b"", b"")
    assert looked.is_set()
    assert told == [(box.pid, True, cgroup_of(os.getpid(), "memory"))]  # the init's own pid, alive, in our cgroup
    assert took < 20  # the host's word ended the wait, not the wait's 60 s


@pytest.mark.parametrize("command, status", [("exit 9", 9), ("kill -TERM $$", 143), ("kill -KILL $$", 137)])
def test_only_a_command_killed_by_sigkill_is_told(tmp_path, command, status):
    """Each init on a broker of its own, its connection the first: the one the broker hears `killed` on."""
    path = str(tmp_path / "host.sock")
    broker = Broker(path)
    told: list[int] = []
    broker.killed = told.append
    try:
        box = init(path, command)
        assert box.wait(timeout=30) == status
    finally:
        broker.close()
    assert told == ([box.pid] if status == 137 else [])


def test_only_the_inits_own_connection_is_heard_when_it_says_killed(tmp_path):
    """Any other process in the box may send the frame too: it earns an error and the host reads nothing."""
    path = str(tmp_path / "host.sock")
    broker = Broker(path)
    told: list[int] = []
    broker.killed = told.append
    lifeline = socket.socket(socket.AF_UNIX)
    other = socket.socket(socket.AF_UNIX)
    try:
        lifeline.connect(path)
        lifeline.sendall(protocol.encode({"kind": "hello", "role": "lifeline", "serves": ["exec"]}))
        other.connect(path)
        other.sendall(protocol.encode({"kind": "killed"}))
        answer, _ = protocol.read_frame(other.makefile("rb"))
        assert answer["kind"] == "error" and told == []
        lifeline.sendall(protocol.encode({"kind": "killed"}))
        noted, _ = protocol.read_frame(lifeline.makefile("rb"))
        assert noted == {"kind": "noted"} and told == [os.getpid()]
    finally:
        lifeline.close()
        other.close()
        broker.close()


def test_a_host_that_says_nothing_holds_the_init_no_longer_than_its_wait(tmp_path):
    """A host that hears but never answers (an older one, or one wedged): the box still ends, after KILLED_WAIT."""
    path = str(tmp_path / "host.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(1)
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.append(listener.accept()[0]), daemon=True).start()
    try:
        started = time.monotonic()
        box = init(path, "kill -9 $$")
        assert box.wait(timeout=30) == 137
        assert 1.5 < time.monotonic() - started < 20
    finally:
        for conn in held:
            conn.close()
        listener.close()

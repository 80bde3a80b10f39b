"""processes.signal_owner: a process named `host:pid:start` is signalled only while it is that very process."""

import signal
import socket
import subprocess

import pytest

from quinebox.processes import owner_id, signal_owner


@pytest.fixture
def child():
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def test_the_named_process_is_signalled(child):
    assert signal_owner(owner_id(child.pid), signal.SIGTERM) is True
    assert child.wait(10) == -signal.SIGTERM


@pytest.mark.parametrize(
    "name",
    [
        lambda pid, host, start: f"{host}:{pid}:{int(start) + 1}",  # the pid handed out anew: another start
        lambda pid, host, start: f"elsewhere-{host}:{pid}:{start}",  # another host's process
        lambda pid, host, start: f"{host}:x{pid}:{start}",  # not a pid
        lambda pid, host, start: f"{host}:{pid}",  # no start
        lambda pid, host, start: "",
    ],
    ids=["reused pid", "other host", "not a pid", "no start", "empty"],
)
def test_anything_but_that_very_process_is_left_alone(child, name):
    start = owner_id(child.pid).rsplit(":", 1)[1]
    assert signal_owner(name(child.pid, socket.gethostname(), start), signal.SIGTERM) is False
    assert child.poll() is None


def test_a_process_that_has_ended_is_not_signalled(child):
    named = owner_id(child.pid)
    child.kill()
    child.wait()
    assert signal_owner(named, signal.SIGTERM) is False

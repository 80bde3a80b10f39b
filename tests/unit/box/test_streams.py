"""Moving bytes when the host holds many boxes: file descriptors past select()'s 1024 still work."""

import os
import resource
import socket
import threading

import pytest

from quinebox.box.streams import relay
from quinebox.worlds.tracker import Tracker


@pytest.fixture
def high_fds():
    """Push the next fds past 1024, as a host with a hundred boxes open does."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 2048:
        pytest.skip("the hard limit on open files is below 2048")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    held = []
    while not held or held[-1] < 1100:
        held.append(os.dup(0) if os.path.exists("/proc/self/fd/0") else os.open(os.devnull, os.O_RDONLY))
    yield
    for fd in held:
        os.close(fd)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_stdin_is_pumped_from_an_fd_past_1024(high_fds):
    read_end, write_end = os.pipe()
    stop_r, stop_w = os.pipe()
    assert read_end > 1024
    ours, theirs = socket.socketpair()
    theirs.settimeout(10)
    pump = threading.Thread(target=relay.pump_fd, args=(read_end, ours, stop_r))
    pump.start()
    os.write(write_end, b"material")
    os.close(write_end)
    pump.join(10)
    assert not pump.is_alive()
    assert theirs.recv(100) == b"material" and theirs.recv(100) == b""  # EOF passed on
    for fd in (read_end, stop_r, stop_w):
        os.close(fd)


def test_a_world_tracker_runs_with_fds_past_1024(high_fds, tmp_path):
    crashes: list = []
    previous = threading.excepthook
    threading.excepthook = lambda args: crashes.append(args.exc_value)
    try:
        tracker = Tracker(str(tmp_path))
        (tmp_path / "f").write_bytes(b"x" * 4096)
        changed = set()
        for _ in range(50):
            changed |= tracker.take()[0]
            if "f" in changed:
                break
            threading.Event().wait(0.05)
        tracker.close()
    finally:
        threading.excepthook = previous
    assert crashes == [] and "f" in changed

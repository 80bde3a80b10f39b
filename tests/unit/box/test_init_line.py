"""The host's end of a box init's lifeline (net/init_line.py), over a real socket pair: what an exec frame
carries, whose end each `exec_exit` is, and that a lifeline's end ends every exec still waited for."""

import os
import socket

import pytest

from quinebox.box.net.broker import Channel
from quinebox.box.net.init_line import EXIT_KILLED, InitLine
from quinebox.errors import EngineError
from quinebox.guest.execs import Line


@pytest.fixture
def line():
    host, box = socket.socketpair()
    yield InitLine(Channel(host)), Line(box)
    host.close()
    box.close()


def test_an_exec_frame_carries_the_command_and_its_four_descriptors(line):
    init, box = line
    fds = [os.open(os.devnull, os.O_RDWR) for _ in range(4)]
    init.start(["sh", "-c", "true"], "/world", ["A=1"], fds)
    (message, received), = box.read()
    assert {k: message[k] for k in ("kind", "argv", "cwd", "env", "fds")} == {"kind": "exec", "argv": ["sh", "-c", "true"], "cwd": "/world", "env": ["A=1"], "fds": 4}
    assert len(received) == 4 and len(message["id"]) == 16
    for fd in [*fds, *received]:
        os.close(fd)


@pytest.mark.parametrize("code, told", [(0, 0), (3, 3), (255, 255), (-1, EXIT_KILLED), (256, EXIT_KILLED), ("0", EXIT_KILLED), (None, EXIT_KILLED)])
def test_each_exit_ends_its_own_exec_with_a_status_a_shell_could_give(line, code, told):
    init, box = line
    first, second = init.start(["a"], "/", [], []), init.start(["b"], "/", [], [])
    ids = [message["id"] for message, _ in box.read()]
    while len(ids) < 2:
        ids += [message["id"] for message, _ in box.read()]
    init.exited({"kind": "exec_exit", "id": ids[1], "code": code})
    assert second.done.is_set() and second.code == told and not first.done.is_set()
    init.exited({"kind": "exec_exit", "id": ids[1], "code": 0})  # told twice: the second is nobody's
    init.exited({"kind": "exec_exit", "id": "never-asked", "code": 0})
    assert second.code == told and not first.done.is_set()


def test_the_lifelines_end_ends_every_exec_as_killed_and_starts_no_more(line):
    init, _ = line
    waiting = [init.start(["sleep", "9"], "/", [], []) for _ in range(3)]
    init.lost()
    assert all(exited.done.is_set() and exited.code == EXIT_KILLED for exited in waiting)
    with pytest.raises(EngineError, match="the box is gone"):
        init.start(["true"], "/", [], [])


def test_a_box_gone_before_the_frame_went_out_is_one_error(line):
    host_side, box = line
    box.sock.close()
    with pytest.raises(EngineError, match="its init no longer answers"):
        for _ in range(100):  # the peer's end is closed: a send fails at once or on the next try
            host_side.start(["true"], "/", [], [])

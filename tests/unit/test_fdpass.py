"""fdpass: one JSON line and the descriptors that ride with it, over a real socket pair."""

import os
import socket

import pytest

from quinebox import fdpass


def test_a_message_and_its_descriptors_arrive_together(tmp_path):
    left, right = socket.socketpair()
    read_end, write_end = os.pipe()
    with left, right:
        fdpass.send(left, {"kind": "claim", "shape": {"ünïcode": [1, 2]}}, [write_end, read_end])
        message, fds = fdpass.receive(right, 2.0)
        assert message == {"kind": "claim", "shape": {"ünïcode": [1, 2]}} and len(fds) == 2
        os.write(fds[0], b"through the passed descriptor")
        assert os.read(read_end, 100) == b"through the passed descriptor"
    for fd in (read_end, write_end, *fds):
        os.close(fd)


@pytest.mark.parametrize("junk", [b"not json\n", b"[1, 2]\n", b'"a string"\n', b"\xff\xfe\n", b"{"])
def test_what_is_not_a_json_object_is_an_empty_message(junk):
    left, right = socket.socketpair()
    with left, right:
        left.sendall(junk)
        left.shutdown(socket.SHUT_WR)
        assert fdpass.receive(right, 2.0) == ({}, [])


def test_a_peer_that_says_nothing_times_out_and_nothing_is_there_to_connect_to(tmp_path):
    left, right = socket.socketpair()
    with left, right, pytest.raises(TimeoutError):
        fdpass.receive(right, 0.2)
    assert fdpass.connect(str(tmp_path / "nobody.sock")) is None


def test_a_long_message_arrives_whole():
    left, right = socket.socketpair()
    big = {"kind": "claim", "shape": "x" * 500_000}
    with left, right:
        import threading

        sender = threading.Thread(target=fdpass.send, args=(left, big))
        sender.start()
        assert fdpass.receive(right, 5.0) == (big, [])
        sender.join()

"""The init's end of its lifeline (guest/execs.py's Line): frames the host sends, with the descriptors that ride
along, read whole however the stream splits them, over a real socket pair."""

import os
import socket

import pytest

from quinebox.box.net.broker import Channel
from quinebox.guest.execs import Line
from quinebox.guest.protocol import encode


@pytest.fixture
def pair():
    host, box = socket.socketpair()
    yield host, box
    host.close()
    box.close()


def test_a_frame_and_its_descriptors_arrive_together(pair, tmp_path):
    host, box = pair
    (tmp_path / "f").write_bytes(b"content")
    opened = [os.open(tmp_path / "f", os.O_RDONLY) for _ in range(4)]
    assert Channel(host).send({"kind": "exec", "id": "a", "fds": 4}, fds=opened)
    frames = Line(box).read()
    assert [message for message, _ in frames] == [{"kind": "exec", "id": "a", "fds": 4}]
    (_, fds), = frames
    assert len(fds) == 4 and set(fds).isdisjoint(opened)  # the box's own numbers for the same open files
    assert os.pread(fds[0], 7, 0) == b"content"
    for fd in [*fds, *opened]:
        os.close(fd)


def test_frames_split_and_joined_anyhow_are_read_whole_in_order(pair):
    host, box = pair
    stream = encode({"kind": "a"}) + encode({"kind": "b", "n": 2}) + encode({"kind": "c"}, b"payload")
    line = Line(box)
    got = []
    for cut in (3, 11, 12, len(stream)):  # inside a header, inside a body, between frames, the rest
        host.sendall(stream[:cut])
        stream = stream[cut:]
        got += [message for message, _ in line.read()]
    assert got == [{"kind": "a"}, {"kind": "b", "n": 2}, {"kind": "c"}]


def test_descriptors_go_to_the_frame_that_counts_them(pair, tmp_path):
    host, box = pair
    first, second = (os.open(tmp_path, os.O_RDONLY) for _ in range(2))
    channel = Channel(host)
    assert channel.send({"kind": "other"})
    assert channel.send({"kind": "exec", "id": "1", "fds": 1}, fds=[first])
    assert channel.send({"kind": "exec", "id": "2", "fds": 1}, fds=[second])
    line, frames = Line(box), []
    while len(frames) < 3:
        frames += line.read()
    assert [len(fds) for _, fds in frames] == [0, 1, 1]
    for fd in [first, second, *(fd for _, fds in frames for fd in fds)]:
        os.close(fd)


def test_the_hosts_end_is_eof(pair):
    host, box = pair
    host.close()
    with pytest.raises(EOFError):
        Line(box).read()

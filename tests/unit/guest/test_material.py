"""The agent's material on fd 3, fed through a pipe of its own: the count of what its tools read is exact, at any
moment between two reads, however much the feeder has written ahead of them; the pipe ends when the material does."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from quinebox.guest import material


@pytest.fixture
def fed():
    """(the stdin writer, the read end the tools read, the socket to ask on) with `feed` running on a thread."""
    source_r, source_w = os.pipe()
    read_end, write_end = os.pipe()
    ours, theirs = socket.socketpair()
    feeder = threading.Thread(target=material.feed, args=(source_r, read_end, write_end, theirs), daemon=True)
    feeder.start()
    yield source_w, read_end, ours
    ours.close()  # the agent gone: the feeder leaves
    feeder.join(timeout=10)
    assert not feeder.is_alive()
    for fd in (source_r, read_end):
        os.close(fd)
    theirs.close()


def read_exactly(fd: int, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = os.read(fd, count - len(data))
        assert chunk
        data += chunk
    return data


def test_what_the_tools_read_is_counted_not_what_was_fed(fed):
    stdin, tools, asker = fed
    os.write(stdin, b"l1\nl2\nl3\n")
    assert material.ask(asker) == 0  # nothing read yet, whatever the feeder has written
    assert read_exactly(tools, 3) == b"l1\n"
    assert material.ask(asker) == 3
    assert read_exactly(tools, 6) == b"l2\nl3\n"
    assert material.ask(asker) == 9
    os.close(stdin)
    assert os.read(tools, 10) == b""  # the material ended, and so does the pipe
    assert material.ask(asker) == 9


def test_a_material_larger_than_any_pipe_is_counted_to_the_byte(fed):
    stdin, tools, asker = fed
    data = os.urandom(3 << 20)

    def write() -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(stdin, view) :]
        os.close(stdin)

    writer = threading.Thread(target=write)
    writer.start()
    got = read_exactly(tools, 1_000_003)
    assert material.ask(asker) == 1_000_003  # the feeder holds up to a pipe and a chunk more, unread: not counted
    while chunk := os.read(tools, 1 << 16):
        got += chunk
    writer.join()
    assert got == data and material.ask(asker) == len(data)


def test_a_feeder_that_cannot_answer_says_nothing():
    ours, theirs = socket.socketpair()
    theirs.close()
    assert material.ask(ours) is None
    assert material.ask(None) is None
    ours.close()


def test_start_puts_the_pipe_on_the_target_and_the_tools_read_through_it(tmp_path):
    source = tmp_path / "material"
    source.write_bytes(b"abc\ndef\n")
    target = os.open(os.devnull, os.O_RDONLY)  # a number of our own for the pipe to take
    asker = material.start(os.open(source, os.O_RDONLY), target)
    try:
        assert read_exactly(target, 4) == b"abc\n"
        assert material.ask(asker) == 4
        assert os.read(target, 100) == b"def\n" and os.read(target, 100) == b""
        assert material.ask(asker) == 8
    finally:
        asker.close()  # the feeder, a process of its own, leaves with the socket
        os.close(target)

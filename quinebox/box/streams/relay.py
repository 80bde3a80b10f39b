"""Moving a box's bytes: stdin into the attach connection, stdout/stderr out of it.

The engine multiplexes stdout and stderr on one connection as frames of an
8-byte header (stream, 0, 0, 0, big-endian length) and a payload. Payloads are
forwarded in pieces as they arrive, so nothing is ever buffered whole.
"""

from __future__ import annotations

import io
import os
import select
import socket
from collections.abc import Callable
from typing import Protocol, cast

Sink = Callable[[bytes], None]


class Reader(Protocol):
    """A buffered binary stream: the attach socket's file, read as its bytes arrive (read1: what is there, at once)."""

    def read(self, size: int = ..., /) -> bytes: ...

    def read1(self, size: int = ..., /) -> bytes: ...

    def close(self) -> None: ...

CHUNK = 1 << 18


def reader_of(sock: socket.socket) -> io.BufferedReader:
    """The attach socket's bytes, buffered CHUNK at a time (what socket.makefile returns for "rb", said as such)."""
    return cast(io.BufferedReader, sock.makefile("rb", buffering=CHUNK))


def fd_sink(fd: int) -> Sink:
    def write(data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]

    return write


def discard(_data: bytes) -> None:
    pass


def demux(reader: Reader, stdout: Sink, stderr: Sink) -> None:
    """Route frames until the engine closes the stream (the box's outputs are closed)."""
    sinks = {1: stdout, 2: stderr}
    while True:
        header = reader.read(8)
        if len(header) < 8:
            return
        sink = sinks.get(header[0], stderr)
        left = int.from_bytes(header[4:8], "big")
        while left:
            data = reader.read1(min(left, CHUNK))
            if not data:
                return
            left -= len(data)
            sink(data)


def copy(reader: Reader, sink: Sink) -> None:
    """A terminal's output: raw bytes until the engine closes the stream."""
    while True:
        data = reader.read1(CHUNK)
        if not data:
            return
        sink(data)


def pump_fd(fd: int, sock: socket.socket, stop_fd: int) -> None:
    """Copy `fd` into the box's stdin until EOF (then close the box's stdin) or until told to stop.

    A source that cannot be read (closed, not open at all) counts as EOF. It
    polls rather than selects: a host with many boxes open has fds past 1024.
    """
    poller = select.poll()
    for watched in (fd, stop_fd):
        poller.register(watched, select.POLLIN)
    while True:
        try:
            ready = {ready_fd for ready_fd, _ in poller.poll()}
            if stop_fd in ready:
                return
            data = os.read(fd, CHUNK)
        except OSError:
            data = b""
        if not data:
            break
        try:
            sock.sendall(data)
        except OSError:
            return  # the box is gone or stopped reading: nothing more to deliver
    try:
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def pump_bytes(data: bytes, sock: socket.socket) -> None:
    try:
        view = memoryview(data)
        for start in range(0, len(view), CHUNK):
            sock.sendall(view[start : start + CHUNK])
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass


class StdinWriter:
    """`Popen.stdin` for stdin=PIPE: writes go straight to the box; close() is EOF."""

    def __init__(self, sock: socket.socket):
        self._sock = sock
        self.closed = False

    def write(self, data: bytes) -> int:
        self._sock.sendall(data)
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self._sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def __enter__(self) -> StdinWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def guarded(sink: Sink, broken: Callable[[], None]) -> Sink:
    """`sink`, calling `broken` once when its reader has gone away and dropping everything after."""
    gone = False

    def write(data: bytes) -> None:
        nonlocal gone
        if gone:
            return
        try:
            sink(data)
        except BrokenPipeError:
            gone = True
            broken()

    return write

"""A box's stdin, stdout and stderr relayed over the engine's attach connection (the Docker backend's way).

The mirror of streams/direct.py, ranked at streams' tier (tests/unit/test_layout.py): the same
`subprocess.Popen`-style stream arguments, here turned into sinks the connection's frames are routed to
(relay.demux) and a pump that feeds the box's stdin into the connection.
A reader that went away stops the box, as SIGPIPE would stop a process.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from typing import IO, Any

from quinebox.box.streams import relay
from quinebox.box.streams.direct import DEVNULL, PIPE, Stream


class AttachedStdio:
    def __init__(self, sock: socket.socket, stdout: Stream, stderr: Stream, *, tty: bool, broken: Callable[[], None], name: str):
        self.stdin: relay.StdinWriter | None = None
        self.stdout: IO[bytes] | None = None
        self.stderr: IO[bytes] | None = None
        self._sock = sock
        self._name = name
        self._broken = broken
        self._pipe_ends: list[int] = []
        self._pump: threading.Thread | None = None
        out = relay.guarded(self._sink(stdout, 1, "stdout"), broken)
        #: Where the host's own diagnostics about the box go: the box's stderr.
        self.err = relay.guarded(self._sink(stderr, 2, "stderr"), broken)
        reader = relay.reader_of(sock)
        # A terminal has one output, not multiplexed: all of it is the box's stdout.
        self._demux = self._spawn(self._relay, "demux", reader, out, None if tty else self.err)

    def _spawn(self, target: Callable[..., None], what: str, *args: Any) -> threading.Thread:
        thread = threading.Thread(target=target, args=args, name=f"{what}:{self._name}", daemon=True)
        thread.start()
        return thread

    def _sink(self, target: Stream, fd: int, attr: str) -> relay.Sink:
        if target is None:
            return relay.fd_sink(fd)
        if target == DEVNULL:
            return relay.discard
        if target == PIPE:
            read_end, write_end = os.pipe()
            setattr(self, attr, os.fdopen(read_end, "rb"))
            self._pipe_ends.append(write_end)
            return relay.fd_sink(write_end)
        if callable(target):
            return target
        return relay.fd_sink(target if isinstance(target, int) else target.fileno())

    def _relay(self, reader: relay.Reader, out: relay.Sink, err: relay.Sink | None) -> None:
        try:
            if err is None:
                relay.copy(reader, out)
            else:
                relay.demux(reader, out, err)
        except OSError:
            pass
        finally:
            reader.close()
            self._close_pipe_ends()

    def connect_stdin(self, stdin: Stream | bytes, stop_fd: int) -> None:
        """Feed the box's stdin (after the box started: the engine drops what comes before)."""
        if stdin == PIPE:
            self.stdin = relay.StdinWriter(self._sock)
        elif stdin == DEVNULL:
            relay.StdinWriter(self._sock).close()
        elif isinstance(stdin, (bytes, bytearray, memoryview)):
            self._pump = self._spawn(relay.pump_bytes, "stdin", bytes(stdin), self._sock)
        else:
            fd = 0 if stdin is None else stdin if isinstance(stdin, int) else stdin.fileno()  # type: ignore[union-attr]  # a callable Stream is an output sink: a stdin here is a file
            self._pump = self._spawn(relay.pump_fd, "stdin", fd, self._sock, stop_fd)

    def drain(self, timeout: float) -> None:
        """Wait until the engine has delivered all of the box's output."""
        self._demux.join(timeout)

    def close(self) -> None:
        """After the pump was told to stop (its stop fd written): let it leave, and end our outputs."""
        if self._pump is not None:
            self._pump.join(1.0)  # it leaves as soon as it sees the stop
        self._close_pipe_ends()

    def _close_pipe_ends(self) -> None:
        ends, self._pipe_ends = self._pipe_ends, []
        for fd in ends:
            os.close(fd)

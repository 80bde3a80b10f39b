"""A box's terminal on an OCI runtime: the pty master the runtime hands over its console socket, relayed.

With `-t` the box's stdin, stdout and stderr are one pseudo-terminal, made by the runtime inside the box; its
master side comes to us over a Unix socket (`--console-socket`) while the box is created. From then on this
is what the engine's attach connection is for a terminal box: keystrokes (Ctrl-C included, as a byte the box's
line discipline turns into SIGINT) go to the master, and everything the box shows comes back as one stream on
stdout. The window's size is set on the master.
"""

from __future__ import annotations

import fcntl
import os
import select
import socket
import struct
import termios
import threading
from typing import IO

from quinebox.box.streams import relay
from quinebox.box.streams.direct import DEVNULL, PIPE, Stream
from quinebox.errors import EngineError

SHORT_PREFIX = "quinebox-tty-"
#: How long the runtime may take to hand the master over once the box is created.
HANDOVER_TIMEOUT = 10.0


class ConsoleSocket:
    """Where the runtime hands over the master: listened on before the box is created, read once it is."""

    def __init__(self, path: str):
        self.path = path
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(path)
        self._listener.listen(1)
        self._listener.settimeout(HANDOVER_TIMEOUT)

    def master(self) -> int:
        try:
            conn, _ = self._listener.accept()
            with conn:
                conn.settimeout(HANDOVER_TIMEOUT)
                _, fds, _, _ = socket.recv_fds(conn, 1024, 1)
        except OSError as exc:
            raise EngineError(f"the OCI runtime did not hand over the box's terminal: {exc}") from None
        finally:
            self.close()
        if not fds:
            raise EngineError("the OCI runtime handed over no terminal for the box")
        return fds[0]

    def close(self) -> None:
        self._listener.close()
        try:
            os.unlink(self.path)
            if os.path.basename(os.path.dirname(self.path)).startswith(SHORT_PREFIX):
                os.rmdir(os.path.dirname(self.path))
        except OSError:
            pass


class ConsoleRelay:
    """The caller's streams to and from the master. stdin: None (fd 0), an fd or file, PIPE, bytes or DEVNULL;
    stdout: None (fd 1), an fd or file, PIPE, a callable or DEVNULL. stderr is the terminal's too."""

    def __init__(self, stdin: Stream | bytes, stdout: Stream, stop_fd: int):
        self.stdin: IO[bytes] | None = None
        self.stdout: IO[bytes] | None = None
        self._stop_fd = stop_fd
        self._master: int | None = None
        self._threads: list[threading.Thread] = []
        self._input_r: int | None = None
        self._input_bytes: bytes | None = None
        if stdin == PIPE:
            self._input_r, write_end = os.pipe()
            self.stdin = os.fdopen(write_end, "wb", buffering=0)
        elif isinstance(stdin, (bytes, bytearray, memoryview)):
            self._input_bytes = bytes(stdin)
        elif stdin != DEVNULL:
            self._input_r = os.dup(0 if stdin is None else stdin if isinstance(stdin, int) else stdin.fileno())  # type: ignore[union-attr]  # a callable Stream is an output sink: a stdin here is a file
        self._out_w: int | None = None
        self._lock = threading.Lock()
        if stdout == PIPE:
            read_end, self._out_w = os.pipe()
            self.stdout = os.fdopen(read_end, "rb")
            self._sink = relay.fd_sink(self._out_w)
        elif stdout == DEVNULL:
            self._sink = relay.discard
        elif callable(stdout):
            self._sink = stdout
        else:
            self._sink = relay.fd_sink(1 if stdout is None else stdout if isinstance(stdout, int) else stdout.fileno())

    def attach(self, master: int) -> None:
        self._master = master
        for target in (self._output, self._input):
            thread = threading.Thread(target=target, daemon=True)
            thread.start()
            self._threads.append(thread)

    def _output(self) -> None:
        assert self._master is not None
        try:
            while True:
                data = os.read(self._master, relay.CHUNK)
                if not data:
                    return
                self._sink(data)
        except OSError:  # EIO: every process of the box has let go of the terminal
            pass
        finally:
            self._close_output()

    def _close_output(self) -> None:
        with self._lock:
            fd, self._out_w = self._out_w, None
        if fd is not None:
            os.close(fd)

    def _input(self) -> None:
        assert self._master is not None
        try:
            if self._input_bytes is not None:
                relay.fd_sink(self._master)(self._input_bytes)
                return
            if self._input_r is None:
                return
            poller = select.poll()
            for fd in (self._input_r, self._stop_fd):
                poller.register(fd, select.POLLIN)
            while True:
                ready = {fd for fd, _ in poller.poll()}
                if self._stop_fd in ready:
                    return
                data = os.read(self._input_r, relay.CHUNK)
                if not data:
                    return  # a terminal has no end of input to pass on: the box goes on until it exits
                relay.fd_sink(self._master)(data)
        except OSError:
            pass

    def resize(self, rows: int, cols: int) -> None:
        if self._master is not None:
            try:
                fcntl.ioctl(self._master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
            except OSError:
                pass

    def drain(self, timeout: float) -> None:
        if self._threads:
            self._threads[0].join(timeout)

    def close(self) -> None:
        """Once the box is gone and the stop fd was written: the relays leave (the master reads EIO), our ends close."""
        for thread in self._threads:
            thread.join(1.0)
        self._close_output()
        for fd in (self._input_r, self._master):
            if fd is not None:
                os.close(fd)
        self._input_r = self._master = None
        if self.stdin is not None and not self.stdin.closed:
            self.stdin.close()


def console_path(bundle: str) -> str:
    """A socket path a runtime can connect to (at most 107 bytes): in the bundle, or else a short one of its own."""
    path = os.path.join(bundle, "console.sock")
    if len(path.encode()) < 100:
        return path
    import tempfile

    return os.path.join(tempfile.mkdtemp(prefix=SHORT_PREFIX), "console.sock")

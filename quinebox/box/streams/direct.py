"""A box's stdin, stdout and stderr as file descriptors the box's process holds itself (the OCI runtime's way).

`BoxProcess` takes stream arguments as `subprocess.Popen` does; on the engine they are relayed over the attach
connection (relay.py), on an OCI runtime each becomes a file descriptor handed to the box: the caller's own
(None, an fd, a file), /dev/null, or a pipe whose other end is ours — `.stdin` / `.stdout` / `.stderr` for PIPE,
a thread for bytes given as input or a callable that takes each chunk. Only those last two copy bytes, as
Popen's own `communicate` would.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Callable
from typing import IO, Any

from quinebox.box.streams import relay

PIPE = -1
DEVNULL = -3

Stream = None | int | IO[Any] | Callable[[bytes], None]


class DirectStdio:
    """`copy_files`: a regular file given as a stream is read or written here, through a pipe, never handed to the
    box. gVisor's sentry reads and writes a host file at an offset of its own, from 0: the box would write over
    what the file held before (`{ echo head; quinebox exec …; } > log`) and read again what was read already.
    stdout and stderr on one file (`> log 2>&1`) share one pipe, so the box's writes land in the order it made them."""

    def __init__(self, stdin: Stream | bytes, stdout: Stream, stderr: Stream, *, copy_files: bool = False):
        self._copy_files = copy_files
        self.stdin: IO[bytes] | None = None
        self.stdout: IO[bytes] | None = None
        self.stderr: IO[bytes] | None = None
        self._box_ends: list[int] = []  # ours to close once the box holds its copies
        self._threads: list[tuple[threading.Thread, int]] = []  # each copier and the end of ours it owns
        self._file_pipes: dict[tuple[int, int], int] = {}  # a copied output file's (st_dev, st_ino): the box's end of its pipe
        self.fds = (self._input(stdin), self._output(stdout, 1, "stdout"), self._output(stderr, 2, "stderr"))
        #: Our own copy of the box's stderr, for the host's diagnostics about the box, until the box is gone.
        self._say_fd: int | None = os.dup(self.fds[2])
        self._say_lock = threading.Lock()

    def _devnull(self, flags: int) -> int:
        fd = os.open(os.devnull, flags)
        self._box_ends.append(fd)
        return fd

    def _thread(self, target: Callable[..., None], fd: int, *args: Any) -> None:
        self._threads.append((threading.Thread(target=target, args=(fd, *args), daemon=True), fd))

    def _input(self, stdin: Stream | bytes) -> int:
        if stdin == DEVNULL:
            return self._devnull(os.O_RDONLY)
        if isinstance(stdin, (bytes, bytearray, memoryview)) or stdin == PIPE:
            read_end, write_end = os.pipe()
            self._box_ends.append(read_end)
            if stdin == PIPE:
                self.stdin = os.fdopen(write_end, "wb", buffering=0)
            else:
                self._thread(_feed, write_end, bytes(stdin))
            return read_end
        fd = 0 if stdin is None else stdin if isinstance(stdin, int) else stdin.fileno()  # type: ignore[union-attr]  # a callable Stream is an output sink: a stdin here is a file
        if self._copy_files and _regular(fd):
            read_end, write_end = os.pipe()
            self._box_ends.append(read_end)
            self._thread(_copy, write_end, fd)
            return read_end
        return fd

    def _output(self, target: Stream, default: int, attr: str) -> int:
        if target == DEVNULL:
            return self._devnull(os.O_WRONLY)
        if target != PIPE and not callable(target):
            fd = default if target is None else target if isinstance(target, int) else target.fileno()
            if not (self._copy_files and _regular(fd)):
                return fd
            info = os.fstat(fd)
            if (info.st_dev, info.st_ino) in self._file_pipes:  # stderr on stdout's file: the same pipe, in order
                return self._file_pipes[info.st_dev, info.st_ino]
            read_end, write_end = os.pipe()
            self._box_ends.append(write_end)
            self._file_pipes[info.st_dev, info.st_ino] = write_end
            self._thread(_drain, read_end, relay.fd_sink(fd))  # the file written here, at the offset its holder shares
            return write_end
        read_end, write_end = os.pipe()
        self._box_ends.append(write_end)
        if target == PIPE:
            setattr(self, attr, os.fdopen(read_end, "rb"))
        else:
            self._thread(_drain, read_end, target)
        return write_end

    def started(self) -> None:
        """The box holds its ends now: close ours (so EOF comes when the box closes them), start the copiers."""
        for fd in self._box_ends:
            os.close(fd)
        self._box_ends = []
        for thread, _ in self._threads:
            thread.start()

    def say(self, data: bytes) -> None:
        """A line from the host into the box's stderr, as if the box had written it."""
        with self._say_lock:
            if self._say_fd is not None:
                try:
                    relay.fd_sink(self._say_fd)(data)
                except OSError:
                    pass

    def box_gone(self) -> None:
        """No more diagnostics: the box's stderr ends (its reader sees EOF) once ours is closed too."""
        with self._say_lock:
            fd, self._say_fd = self._say_fd, None
        if fd is not None:
            os.close(fd)

    def finish(self, timeout: float) -> bool:
        """Wait for the copiers, all of them within `timeout` seconds: the outputs are drained once every process that
        holds them is gone (a command's own background process may hold them after it ends). Whether they were."""
        deadline = time.monotonic() + timeout
        for thread, _ in self._threads:
            if thread.ident is not None:
                thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread, _ in self._threads)

    def close(self) -> None:
        """A box that never started: nothing will read or write our ends."""
        self.box_gone()
        for fd in self._box_ends + [fd for thread, fd in self._threads if thread.ident is None]:
            os.close(fd)
        self._box_ends, self._threads = [], []
        for stream in (self.stdin, self.stdout, self.stderr):
            if stream is not None:
                stream.close()


def _regular(fd: int) -> bool:
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode)
    except OSError:
        return False  # not open: handed on as it is, and the runtime says so as it always has


def _copy(fd: int, source: int) -> None:
    """The caller's file `source` into the box's stdin `fd`, from where the caller has read it to."""
    try:
        while data := os.read(source, relay.CHUNK):
            relay.fd_sink(fd)(data)
    except OSError:
        pass  # the box stopped reading, or the file cannot be read: the box sees its stdin end
    finally:
        os.close(fd)


def _feed(fd: int, data: bytes) -> None:
    try:
        relay.fd_sink(fd)(data)
    except OSError:
        pass  # the box stopped reading: nothing more to deliver
    finally:
        os.close(fd)


def _drain(fd: int, sink: Callable[[bytes], None]) -> None:
    try:
        while True:
            data = os.read(fd, relay.CHUNK)
            if not data:
                return
            sink(data)
    except OSError:
        pass
    finally:
        os.close(fd)

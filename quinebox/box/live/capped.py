"""An exec's output bounded: passed on or kept up to a cap, whatever the box writes into it.

A box's own processes may write into an exec's stdout (they share the box) or never stop writing: so the host
counts the bytes itself. `Taken` (the file operations of box_files.py) kills the exec past its cap; `Kept`
(`Sandbox.exec`'s max_output) drops the rest and says so, and the command goes on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import IO, Protocol


class Started(Protocol):
    """An exec of files.py as started: a BoxExec, or an attached Sandbox's (its owner runs it: handed.py)."""

    stdin: IO[bytes] | None
    timed_out: bool

    def kill(self) -> None: ...

    def wait_drained(self, timeout: float | None = None) -> int:
        """Its exit status; 124 (`timed_out`) once `timeout` has run out and its tree was killed."""
        ...


class Taken:
    """An exec's output, passed on (or kept) up to a cap; past it, nothing more is taken and the exec is killed."""

    def __init__(self, sink: Callable[[bytes], None] | None, cap: int):
        self.sink, self.cap = sink, cap
        self.kept: list[bytes] = []
        self.count = 0
        self.over = self.closed = False
        self._proc: Started | None = None
        self._lock = threading.Lock()

    def __call__(self, chunk: bytes) -> None:
        with self._lock:  # the drain's thread; a late chunk (from a box process holding the pipe) after close goes nowhere
            if self.closed or self.over:
                return
            room = self.cap - self.count
            if len(chunk) > room:
                self.over, chunk = True, chunk[:room]
            self.count += len(chunk)
            if self.sink is None:
                self.kept.append(chunk)
            elif chunk and not self.over:
                self.sink(chunk)
            proc = self._proc if self.over else None
        if proc is not None:
            proc.kill()

    def watch(self, proc: Started) -> None:
        """The exec to kill once the cap is passed (it may have been passed already)."""
        with self._lock:
            self._proc = proc
            over = self.over
        if over:
            proc.kill()

    def close(self) -> None:
        with self._lock:
            self.closed = True

    def text(self) -> str:
        return b"".join(self.kept).decode(errors="replace").strip()


class Kept:
    """An exec's output kept up to a cap (`Sandbox.exec`'s max_output); past it, read and dropped (unlike Taken's,
    the command goes on), and said truncated."""

    def __init__(self, cap: int):
        self.cap, self.count, self.truncated = cap, 0, False
        self.parts: list[bytes] = []

    def __call__(self, chunk: bytes) -> None:  # one drain thread per stream: no lock needed
        room = self.cap - self.count
        if len(chunk) > room:
            self.truncated, chunk = True, chunk[: max(room, 0)]
        if chunk:
            self.parts.append(chunk)
            self.count += len(chunk)

    def bytes(self) -> bytes:
        return b"".join(self.parts)

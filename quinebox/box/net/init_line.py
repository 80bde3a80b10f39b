"""The host's end of a box init's lifeline, as a way to start commands in the box (guest/execs.py).

The box's init says who it is on the first connection it makes to its box's socket (`hello`, role `lifeline`,
serving `exec`), before any other process runs in the box; the broker hands that connection to an `InitLine`. Each exec is one
frame sent with its four descriptors in one sendmsg, and ends with the init's `exec_exit` for it. When the
lifeline ends the box is gone, and so is every exec in it: each still waited for ends as killed.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any, Protocol

from quinebox.errors import EngineError

#: The status of an exec whose box went away before the init told its own (as a shell reports SIGKILL).
EXIT_KILLED = 137


class Sender(Protocol):
    def send(self, message: dict[str, Any], payload: bytes = b"", fds: Sequence[int] = ()) -> bool: ...


class Exited:
    """An exec's end, as the init tells it: `code` once `done` is set."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.code = EXIT_KILLED

    def set(self, code: int) -> None:
        self.code = code
        self.done.set()


class InitLine:
    """A box's init, reached over its lifeline: it starts execs and tells how each ended."""

    def __init__(self, channel: Sender):
        self.channel = channel
        self._lock = threading.Lock()
        self._waiting: dict[str, Exited] = {}
        self._lost = False

    def start(self, argv: Sequence[str], cwd: str, env: Sequence[str], fds: Sequence[int]) -> Exited:
        """Ask the init to run `argv` in `cwd` with the box's environment and `env` added, on `fds` (stdin,
        stdout, stderr and the child's end of its socket pair: guest/execs.py)."""
        exec_id = os.urandom(8).hex()
        exited = Exited()
        with self._lock:
            if self._lost:
                raise EngineError("the box is gone: nothing more runs in it")
            self._waiting[exec_id] = exited
        frame = {"kind": "exec", "id": exec_id, "argv": list(argv), "cwd": cwd, "env": list(env), "fds": len(fds)}
        if not self.channel.send(frame, fds=fds):
            with self._lock:
                self._waiting.pop(exec_id, None)
            raise EngineError("the box is gone: its init no longer answers")
        return exited

    def exited(self, message: dict[str, Any]) -> None:
        """The init's `exec_exit`: one it was never asked for is ignored."""
        with self._lock:
            exited = self._waiting.pop(str(message.get("id")), None)
        code = message.get("code")
        if exited is not None:
            exited.set(code if isinstance(code, int) and 0 <= code <= 255 else EXIT_KILLED)

    def lost(self) -> None:
        """The lifeline ended: the box is gone, and every exec with it."""
        with self._lock:
            self._lost = True
            waiting, self._waiting = list(self._waiting.values()), {}
        for exited in waiting:
            exited.set(EXIT_KILLED)

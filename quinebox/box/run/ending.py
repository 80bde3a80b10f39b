"""How a box ended, as one value: what ended it, its exit status, and the line that says why.

A box's end has two sources. The host may end it first, for a cause of its
own: its time ran out, its world grew past its grant, its reader went away,
someone killed it, the engine stopped answering, or quinebox itself failed.
Then the box's own exit arrives (its status, whether the kernel's OOM killer
struck, whether gVisor's sandbox died). `Ends` collects both as they come —
the first cause wins, under a lock, since the timer, the engine's watch and
the caller's threads race — and `settle` makes them one frozen `Ending`, from
which the box's returncode, its termination and the flags of the
`subprocess`-like surface are all read. The codes are those of docs/exec.md:
124 time, 125 quinebox failed, 137 killed.
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass, replace

from quinebox.errors import EXIT_QUINEBOX

EXIT_TIMEOUT = 124
#: The status of a box whose own status was never told: the engine kills what it loses track of.
EXIT_KILLED = 137


class How(enum.Enum):
    """What ended a box. The first six are the host's causes; the last four the box's own exit."""

    TIMED_OUT = "time"
    WORLD_FULL = "world_full"
    READER_GONE = "reader_gone"
    KILLED = "killed"
    ENGINE_LOST = "engine_lost"
    INTERNAL_ERROR = "internal_error"
    SANDBOX_DIED = "sandbox_died"
    OOM = "oom"
    SIGNALLED = "signalled"
    EXITED = "exit"


#: The causes whose returncode is quinebox's own, not the box's status.
_OWN_CODE = {How.TIMED_OUT: EXIT_TIMEOUT, How.ENGINE_LOST: EXIT_QUINEBOX, How.INTERNAL_ERROR: EXIT_QUINEBOX}
#: The endings whose termination is their one line (what `box_ended` records and the CLI prints).
_SAID = (How.ENGINE_LOST, How.WORLD_FULL, How.SANDBOX_DIED, How.INTERNAL_ERROR)


@dataclass(frozen=True)
class Exit:
    """The box's own end, as its backend told it."""

    code: int
    #: The kernel's OOM killer killed a process in the box (its init may have survived that).
    oom: bool = False
    #: Why gVisor's sandbox itself died, if it did (the box was killed with it).
    sandbox_died: str | None = None


@dataclass(frozen=True)
class Ending:
    """How one box ended: `how`, the returncode `code`, whether an OOM kill happened, and the line saying why."""

    how: How
    code: int
    oom: bool = False
    reason: str | None = None

    @property
    def termination(self) -> str:
        """The box's termination as the tree's `box_ended` record says it."""
        if self.how in _SAID:
            return self.reason or self.how.value
        if self.how is How.TIMED_OUT:
            return "time"
        return "oom" if self.oom else "exit"

    def said(self, how: How) -> str | None:
        """The line of this ending if it is `how`, else None (what `world_full`, `engine_lost`, … read)."""
        return self.reason if self.how is how else None


def decide(cause: How | None, reason: str | None, exit: Exit | None) -> Ending:
    """The one ending of a box from the host's first cause (if any) and the box's exit (if it was told)."""
    code = exit.code if exit is not None else EXIT_KILLED
    oom = exit.oom if exit is not None else False
    if cause is not None:
        return Ending(cause, _OWN_CODE.get(cause, code), oom, reason)
    if exit is not None and exit.sandbox_died:
        return Ending(How.SANDBOX_DIED, code, oom, exit.sandbox_died)
    if oom and code == EXIT_KILLED:
        return Ending(How.OOM, code, oom)
    return Ending(How.SIGNALLED if code >= 128 else How.EXITED, code, oom)


class Ends:
    """What is known of a box's end so far; `settle` freezes it into its `Ending`.

    `exited` is set once the box's status is known, `gone` once the box is (its
    wait may end); both are set on `gone`, since a box lost is not waited on.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cause: How | None = None
        self._reason: str | None = None
        self._exit: Exit | None = None
        self._oom = False
        self._ending: Ending | None = None
        self.exited = threading.Event()
        self.gone = threading.Event()

    def cause(self, how: How, reason: str | None = None) -> bool:
        """Record the host's cause for ending the box; only the first counts, and none once settled."""
        with self._lock:
            if self._cause is not None or self._ending is not None:
                return False
            self._cause, self._reason = how, reason
            return True

    @property
    def caused(self) -> bool:
        """Whether the host has ended, or is ending, the box (a kill the engine reports then is ours)."""
        return self._cause is not None

    def oom(self) -> None:
        """The kernel's OOM killer struck in the box (the engine says so before the box's status)."""
        self._oom = True

    def exit(self, code: int, *, oom: bool = False, sandbox_died: str | None = None) -> None:
        """The box's own status; the first told counts."""
        with self._lock:
            if self._exit is None:
                self._exit = Exit(code, oom, sandbox_died)
        self.exited.set()

    def end(self) -> None:
        """The box is gone (or given up): its wait may end."""
        self.exited.set()
        self.gone.set()

    def now(self) -> Ending:
        """The ending as it stands: settled, or what it would be if the box ended now."""
        with self._lock:
            return self._ending or self._decide()

    def settle(self) -> Ending:
        """The box's one ending, decided once; later causes change nothing."""
        with self._lock:
            if self._ending is None:
                self._ending = self._decide()
            return self._ending

    def _decide(self) -> Ending:
        told = self._exit or (Exit(EXIT_KILLED) if self._oom else None)
        if told is not None and self._oom:  # the engine may tell of an OOM kill before the status or after it
            told = replace(told, oom=True)
        return decide(self._cause, self._reason, told)

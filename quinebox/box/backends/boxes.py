"""The seam between a box and its backend: the Box protocol holds every operation a box has, and what it can do.

After docker-py's model objects, runc's `destroy` and BuildBuddy's `CommandContainer`: each backend's listing
(dockerbox.boxes on the engine, runtimebox.runtime_boxes on the OCI runtimes) returns objects of its own kind,
which own their id, labels and remains and implement every operation below, so that nothing above (ps, kill, gc,
execs, long-lived boxes, pause, snapshots) asks which backend a box is on to act on it. What a backend cannot do
is a capability it declares it lacks (`Capabilities`): the caller asks `box.capabilities`, and answers a missing
one with one line, the backend's own reason in it (`why_not`); the protocol's defaults raise `Lacking` for an
operation a backend has not got, so a caller that forgot to ask still gets one line, never a wrong act.
`destroy` is True only when the box and everything it leaves are gone; a False leaves the box listed, for a
later `gc` to try again, and is never reported as a removal.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Protocol

from quinebox.box.backends.exec_cgroups import ExecCgroup
from quinebox.box.policy import LABEL_CREATED, LABEL_OWNER, LABEL_PARENT, LABEL_SESSION, LABEL_USER
from quinebox.errors import QuineboxError

#: A user namespace's id ranges: (uids, gids), each as (first id in the box, count).
IdRanges = tuple[list[tuple[int, int]], list[tuple[int, int]]]


@dataclass(frozen=True)
class Capabilities:
    """What a backend's box can do; a False is answered by the caller with one line (`Box.why_not` says why)."""

    #: Its processes stopped where they are, and let go on (`freeze`, `thaw`).
    pause: bool = False
    #: A snapshot of its memory and processes taken, and a copy restored from it (`checkpoint`).
    checkpoint: bool = False
    #: A user namespace of its own, whose root is no one outside: an exec may run as the box's root (`id_ranges`).
    own_user_namespace: bool = False
    #: Its processes are the host's (host pids, host cgroups): its init may fork an exec, placed in a cgroup of its own.
    host_processes: bool = True
    #: A regular file of the host's may be a box's stdin, stdout or stderr as it is (else it is copied through a pipe).
    stdio_files: bool = True

    @property
    def lacking(self) -> tuple[str, ...]:
        return tuple(f.name for f in fields(self) if not getattr(self, f.name))


class Lacking(QuineboxError):
    """An operation the box's backend has not got (a capability it lacks)."""


class Way:
    """One exec's start, end and status on its box's backend, as BoxExec (live/execs.py) drives it: made (by
    `Box.exec_way`, or the box's init's way in live/exec_ways.py), then started (`start`), so that what it made
    before a failure (its cgroup) is there to undo."""

    def __init__(self, box: Box, session: str, *, tty: bool, guard: bool):
        self.box, self.session, self.tty, self.guard = box, session, tty, guard
        #: The exec's own cgroup, once made (none under gVisor).
        self.cgroup: ExecCgroup | None = None
        #: The watchdog's pipe (`guard`), once it runs.
        self.watchdog: int | None = None

    def start(self, argv: Sequence[str], cwd: str, env: Sequence[str], user: str, fds: tuple[int, int, int]) -> None:
        raise NotImplementedError

    @property
    def copy_files(self) -> bool:
        """Whether a regular file among the exec's streams is read or written by us (direct.DirectStdio)."""
        return False

    def kill_untracked(self) -> None:
        """Kill the exec's tree where it has no cgroup to kill."""

    def resize(self, rows: int, cols: int) -> None:
        """The command's terminal takes this size (where the backend does not follow this terminal itself)."""

    def ended(self, timeout: float | None) -> bool:
        raise NotImplementedError

    def status(self) -> int:
        """The command's exit status, once ended; what the way holds of it let go."""
        raise NotImplementedError


class Box(Protocol):
    """One box on some backend, as listed; its label-given facts are read here, alike for every backend."""

    #: The backend's own id of it (the engine's container id, the runtime's container id).
    id: str
    labels: Mapping[str, str]
    #: Which backend: the engine's name, or the OCI runtime's.
    backend: str
    #: running, exited, created, stopped… as the backend says it.
    state: str
    #: What its main process runs, as one line.
    command: str
    #: The unpacked image tree its root lies over ("" on the engine, which keeps its own images).
    image_root: str
    #: When the backend says it was made (seconds since the epoch), for a box without its created label.
    made: float

    def kill(self, signal: str = "KILL") -> bool:
        """Signal its processes; False only when the backend did not answer (a stopped box is not running either way)."""
        ...

    def destroy(self) -> bool:
        """Remove it and its remains (killed first if it runs); True only when all of it is gone."""
        ...

    def process(self) -> tuple[str, str]:
        """Its main process's user (`uid:gid` or a name) and working directory: what an exec in it runs as, and where."""
        ...

    # -- what it can do, and each operation a backend may lack (the defaults: lacked, in one line) ------------

    #: What this box's backend can do with it.
    capabilities: Capabilities
    #: The backend as a person reads it in one line ("the Docker engine", "runc", "gVisor (runsc)").
    label: str

    def why_not(self, capability: str) -> str:
        """Why the box lacks `capability` (a field of Capabilities), as a clause a caller's one line ends with."""
        return f"a box on {self.label} cannot {capability.replace('_', ' ')}"

    def lacking(self, capability: str) -> Lacking:
        return Lacking(f"box {self.session}: {self.why_not(capability)}")

    def freeze(self) -> None:
        """Stop every process of it where it is; it stays killable (`thaw` lets them go on)."""
        raise self.lacking("pause")

    def thaw(self) -> None:
        raise self.lacking("pause")

    def exec_way(self, session: str, *, tty: bool, guard: bool) -> Way:
        """The backend's own exec into it (its runtime's `exec`, the engine's), made and not yet started."""
        raise self.lacking("exec")

    def id_ranges(self) -> IdRanges | None:
        """The uids and gids its user namespace maps; None when it has none of its own."""
        return None

    def held(self) -> bool:
        """Whether this process made it and holds it (what a checkpoint is taken by)."""
        return False

    def execs_running(self) -> int:
        """How many execs the backend runs in it right now, whoever started them."""
        raise self.lacking("checkpoint")

    def host_links(self) -> int:
        """How many connections from inside it to the host are open."""
        raise self.lacking("checkpoint")

    def signal_init(self, signal: str) -> None:
        """`signal` to its init alone."""
        raise self.lacking("checkpoint")

    def checkpoint(self, image: str, stdio: tuple[int, int, int], meanwhile: Callable[[], None]) -> None:
        """Its memory and processes written into `image`; it goes on as a successor with `stdio` (this process's
        box only: `held`), `meanwhile` run while nothing of it runs."""
        raise self.lacking("checkpoint")

    @property
    def session(self) -> str:
        return self.labels.get(LABEL_SESSION, "?")

    @property
    def owner(self) -> str:
        return self.labels.get(LABEL_OWNER, "?")

    @property
    def parent(self) -> str:
        return self.labels.get(LABEL_PARENT, "")

    @property
    def user(self) -> str:
        """The uid of whoever started it ("" for a box from before quinebox recorded it)."""
        return self.labels.get(LABEL_USER, "")

    @property
    def created(self) -> float:
        return created_at(self.labels, self.made)


def created_at(labels: Mapping[str, str], made: float) -> float:
    """When a box was made (seconds since the epoch): its created label's time, else the backend's `made`."""
    try:
        return datetime.fromisoformat(labels.get(LABEL_CREATED, "")).timestamp()
    except ValueError:
        return made or time.time()


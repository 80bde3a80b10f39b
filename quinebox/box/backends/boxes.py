"""A box as every backend lists it: its id, labels and owner, and the one way to kill it, exec into it and remove it.

After docker-py's model objects and runc's `destroy`: each backend's listing (DockerBackend.boxes on the engine,
runtimebox.runtime_boxes on the OCI runtimes) returns objects of its own kind, which own their id, labels and
remains, so that nothing above (ps, kill, gc, execs, long-lived boxes) asks which backend a box is on to act on it.
`destroy` is True only when the box and everything it leaves are gone; a False leaves the box listed, for a
later `gc` to try again, and is never reported as a removal.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import datetime
from typing import Protocol

from quinebox.box.policy import LABEL_CREATED, LABEL_OWNER, LABEL_PARENT, LABEL_SESSION, LABEL_USER


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


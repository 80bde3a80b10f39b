"""A backend as shared code sees it: the one object each backend registers (registry.py), after BuildBuddy's
`CommandContainer` seam: callers ask it, never which backend they have.

A backend contributes to every stage of a box's life from its own modules: its boxes as listed and reopened
(the Box protocol, boxes.py), its launch (run/), its warm boxes and their shapes (pool/), and the way
`quinebox doctor` judges it. Shared code (run/launch.py's `Launch`, pool/warm.py's `Pool`, live/, owners/) is
handed what the backend made, or asks the registry by a name it was given (a choice's, a record's, a shape's);
it never imports a backend's module and never compares a backend's name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from quinebox.box.backends.boxes import Box
    from quinebox.box.backends.choice import Choice
    from quinebox.box.backends.docker.engine import DockerBackend
    from quinebox.box.backends.ways import Way
    from quinebox.box.pool.warm import Kept
    from quinebox.box.run.ending import Ends
    from quinebox.box.run.launch import Launch
    from quinebox.box.spec import BoxSpec

#: The engine's client, connected when first asked (a warm box of the engine's, a shape of it).
Engine = Callable[[], "DockerBackend"]


class Backend(Protocol):
    """One backend: how boxes of it are launched, kept warm, reopened and judged."""

    #: Its name as a choice says it (`--backend NAME`), and as its shapes carry it.
    name: str
    #: Whether its boxes' roots are images unpacked on this machine (images/rootfs.py), not kept by an engine.
    unpacks_images: bool
    #: Whether its boxes are the Docker engine's containers: an engine that cannot be reached may hold some.
    needs_engine: bool

    def serves(self, name: str) -> bool:
        """Whether a box recorded or listed as on `name` (a choice's backend, a record's, a listed box's) is its."""
        ...

    def boxes(self, engine: DockerBackend | None, *, connect: bool) -> list[Box]:
        """Every quinebox box on this backend (on the engine: `engine`, or one connected to unless `connect` is
        False); EngineError when the backend does not answer."""
        ...

    def reopen(self, name: str, container: str, labels: Mapping[str, str], engine: DockerBackend | None) -> Box:
        """The box a record names, by the backend `name` it was recorded on and its id (no listing asked)."""
        ...

    def launch(self, choice: Choice, engine: DockerBackend | None, ends: Ends, *, session: str, reader_gone: Callable[[], None]) -> Launch:
        """The launch of a box chosen for this backend."""
        ...

    def well_formed(self, shape: Any) -> bool:
        """Whether what a claimer sent has the form of this backend's shape (the pool makes boxes of it only if so)."""
        ...

    def image_of(self, shape: dict[str, Any]) -> str:
        """The short id of a shape's image, as `serve status` shows it."""
        ...

    def make_warm(self, shape: dict[str, Any], engine: Engine) -> Kept:
        """A warm box of `shape`, started by the pool's keeper."""
        ...

    def default_shape(self, spec: BoxSpec, choice: Choice, engine: Engine) -> dict[str, Any] | None:
        """The shape of `spec` (`quinebox exec -- CMD` with no options) on this backend, which the keeper keeps warm."""
        ...

    def doctor_way(self, choice: Choice, ways: list[Way]) -> Way:
        """Which of `quinebox doctor`'s ways the default choice of this backend runs on."""
        ...

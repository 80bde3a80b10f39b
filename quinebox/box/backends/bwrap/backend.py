"""The bubblewrap backend as shared code sees it (seam.Backend): each box one `bwrap` process, started by its
launch (launch.py), listed from its record (listed.py), judged by doctor's bwrap way (ways.py). It keeps no warm
boxes: a bwrap box starts in about the time a warm one is claimed. Registered in backends/registry.py."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from quinebox.box.backends.boxes import Box
from quinebox.box.backends.choice import Choice
from quinebox.box.backends.seam import Engine

if TYPE_CHECKING:
    from quinebox.box.backends.docker.engine import DockerBackend
    from quinebox.box.backends.ways import Way
    from quinebox.box.pool.warm import Kept
    from quinebox.box.run.ending import Ends
    from quinebox.box.run.launch import Launch
    from quinebox.box.spec import BoxSpec


class Bwrap:
    """bubblewrap: a box recorded or listed on it goes by its name, `bwrap`."""

    name = "bwrap"
    unpacks_images = True
    needs_engine = False

    def serves(self, name: str) -> bool:
        return name == self.name

    def boxes(self, engine: DockerBackend | None, *, connect: bool) -> list[Box]:
        """Every bwrap box this state dir's records name (listed.py)."""
        from quinebox.box.backends.bwrap.listed import bwrap_boxes

        return list(bwrap_boxes())

    def reopen(self, name: str, container: str, labels: Mapping[str, str], engine: DockerBackend | None) -> Box:
        from quinebox.box.backends.bwrap.listed import listed_bwrap

        return listed_bwrap(container, labels)

    def launch(self, choice: Choice, engine: DockerBackend | None, ends: Ends, *, session: str, reader_gone: Callable[[], None]) -> Launch:
        from quinebox.box.backends.bwrap.launch import BwrapLaunch

        return BwrapLaunch(ends)

    def well_formed(self, shape: Any) -> bool:
        """No shape is bwrap's: it keeps no warm boxes."""
        return False

    def image_of(self, shape: dict[str, Any]) -> str:
        return ""

    def make_warm(self, shape: dict[str, Any], engine: Engine) -> Kept:
        raise NotImplementedError("bwrap keeps no warm boxes")  # never asked: no shape of bwrap's is well formed

    def default_shape(self, spec: BoxSpec, choice: Choice, engine: Engine) -> dict[str, Any] | None:
        """None: no box of bwrap's is kept warm."""
        return None

    def doctor_way(self, choice: Choice, ways: list[Way]) -> Way:
        from quinebox.box.backends.ways import local_bwrap_way

        return next((w for w in ways if w.name == self.name), None) or local_bwrap_way()


BWRAP = Bwrap()

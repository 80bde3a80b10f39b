"""The Docker backend as shared code sees it (seam.Backend): its launch, its warm boxes and shapes, its boxes
reopened, and its way in `quinebox doctor`, each from the engine's own modules. Registered in backends/registry.py."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from quinebox.box.backends.boxes import Box
from quinebox.box.backends.choice import ENGINE, Choice
from quinebox.box.backends.seam import Engine

if TYPE_CHECKING:
    from quinebox.box.backends.docker.engine import DockerBackend
    from quinebox.box.backends.ways import Way
    from quinebox.box.pool.warm import Kept
    from quinebox.box.run.ending import Ends
    from quinebox.box.run.launch import Launch
    from quinebox.box.spec import BoxSpec


class Docker:
    """The engine: the engine's client is imported only for a box on the engine (its modules import it)."""

    name = ENGINE
    unpacks_images = False
    needs_engine = True

    def serves(self, name: str) -> bool:
        return name == self.name

    def boxes(self, engine: DockerBackend | None, *, connect: bool) -> list[Box]:
        if engine is None and not connect:
            return []
        from quinebox.box.backends.docker.box import boxes
        from quinebox.box.backends.docker.engine import DockerBackend

        return list(boxes(engine or DockerBackend.connect()))

    def reopen(self, name: str, container: str, labels: Mapping[str, str], engine: DockerBackend | None) -> Box:
        from quinebox.box.backends.docker.box import DockerBox
        from quinebox.box.backends.docker.engine import DockerBackend

        return DockerBox(engine or DockerBackend.shared(), {"Id": container, "Labels": dict(labels)})

    def launch(self, choice: Choice, engine: DockerBackend | None, ends: Ends, *, session: str, reader_gone: Callable[[], None]) -> Launch:
        from quinebox.box.backends.docker.launch import DockerLaunch

        return DockerLaunch(engine, ends, session=session, reader_gone=reader_gone)

    def well_formed(self, shape: Any) -> bool:
        from quinebox.box.shape import well_formed

        return well_formed(shape)

    def image_of(self, shape: dict[str, Any]) -> str:
        return str(shape["create"]["image"]).split(":")[-1][:12]

    def make_warm(self, shape: dict[str, Any], engine: Engine) -> Kept:
        from quinebox.box.backends.docker.warm import start_warm

        return start_warm(engine(), shape)

    def default_shape(self, spec: BoxSpec, choice: Choice, engine: Engine) -> dict[str, Any] | None:
        from quinebox.box.backends.docker.configure import configure
        from quinebox.box.shape import shape_of

        spec, _, config = configure(spec, engine())
        return shape_of(spec, config)

    def doctor_way(self, choice: Choice, ways: list[Way]) -> Way:
        from quinebox.box.backends.ways import ENGINE as ENGINE_WAY

        return next(w for w in ways if w.name == ENGINE_WAY)


DOCKER = Docker()

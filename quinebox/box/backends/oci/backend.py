"""The OCI backend as shared code sees it (seam.Backend): runc, crun and gVisor's runsc are runtimes of it, each a
box's Runtime (runtime.py) with its own Capabilities. Its launch, its warm boxes and shapes, its boxes reopened, and
its way in `quinebox doctor`, each from the runtimes' own modules. Registered in backends/registry.py."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from quinebox.box.backends.boxes import Box
from quinebox.box.backends.choice import DEFAULT_RUNTIME, Choice
from quinebox.box.backends.seam import Engine

if TYPE_CHECKING:
    from quinebox.box.backends.docker.engine import DockerBackend
    from quinebox.box.backends.ways import Way
    from quinebox.box.pool.warm import Kept
    from quinebox.box.run.ending import Ends
    from quinebox.box.run.launch import Launch
    from quinebox.box.spec import BoxSpec


class Oci:
    """Every OCI runtime: a box recorded or listed on one goes by the runtime's own name."""

    name = "oci"
    unpacks_images = True
    needs_engine = False

    def serves(self, name: str) -> bool:
        """Any name the registry's other backends do not serve: an OCI runtime goes by its own (runc, runsc, a path's)."""
        return True

    def boxes(self, engine: DockerBackend | None, *, connect: bool) -> list[Box]:
        """On each OCI runtime this state dir has used (one not answering is skipped: `gc` tries again later)."""
        from quinebox.box.backends.oci.listed import runtime_boxes

        return list(runtime_boxes())

    def reopen(self, name: str, container: str, labels: Mapping[str, str], engine: DockerBackend | None) -> Box:
        from quinebox.box.backends.oci.box import oci_runtime
        from quinebox.box.backends.oci.listed import RuntimeBox

        return RuntimeBox(oci_runtime(name), container, labels)

    def launch(self, choice: Choice, engine: DockerBackend | None, ends: Ends, *, session: str, reader_gone: Callable[[], None]) -> Launch:
        from quinebox.box.backends.oci.launch import OciLaunch

        return OciLaunch(choice.runtime or DEFAULT_RUNTIME, ends)

    def well_formed(self, shape: Any) -> bool:
        from quinebox.box.shape import well_formed_oci

        return well_formed_oci(shape)

    def image_of(self, shape: dict[str, Any]) -> str:
        """Its root is the image's unpacked tree, named by the image's id."""
        return str(shape["config"]["root"]["path"]).rstrip("/").split("/")[-2][:12]

    def make_warm(self, shape: dict[str, Any], engine: Engine) -> Kept:
        from quinebox.box.backends.oci.warm import WarmOci

        return WarmOci(shape)

    def default_shape(self, spec: BoxSpec, choice: Choice, engine: Engine) -> dict[str, Any] | None:
        from quinebox.box.backends.oci.configure import configure_oci, release_ids
        from quinebox.box.shape import oci_shape_of

        runtime = choice.runtime or DEFAULT_RUNTIME
        spec, _, oci = configure_oci(spec, runtime)
        release_ids(oci, spec.session)  # a shape holds no box's own ids: each warm box claims its own
        return oci_shape_of(spec, oci, runtime)

    def doctor_way(self, choice: Choice, ways: list[Way]) -> Way:
        from quinebox.box.backends.choice import usable
        from quinebox.box.backends.ways import local_runtime_way

        return next((w for w in ways if w.name == choice.runtime), None) or local_runtime_way(str(choice.runtime), usable)


OCI = Oci()

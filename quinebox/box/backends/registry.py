"""Every backend, by name: one registration line each. The next backend is one new sub-room (backends/NAME/, its
seam.Backend in NAME/backend.py) and one line here, which also makes NAME a name a box's backend is asked by
(NAMES); shared code asks `backend(name)` with the name it was given (a choice's, a record's, a shape's).

Ranked above the backends' own launch and warm modules (tests/unit/test_layout.py), since each backend's object
reaches them; lower shared code (run/launch.py, pool/warm.py) is handed what a backend made, never this.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from quinebox.box.backends.bwrap.backend import BWRAP
from quinebox.box.backends.docker.backend import DOCKER
from quinebox.box.backends.oci.backend import OCI
from quinebox.box.backends.seam import Backend

if TYPE_CHECKING:
    from quinebox.box.backends.choice import Choice
    from quinebox.box.backends.docker.engine import DockerBackend
    from quinebox.box.run.ending import Ends
    from quinebox.box.run.launch import Launch

#: The backends, in the order they are asked whether a name is theirs: the OCI backend, which takes every
#: runtime's own name, last.
BACKENDS: dict[str, Backend] = {
    DOCKER.name: DOCKER,
    BWRAP.name: BWRAP,
    OCI.name: OCI,
}
#: Every name a box's backend may be asked for by (--backend, BoxOptions.backend, QUINEBOX_BACKEND, config.yaml):
#: `auto` (choice.py decides) and each backend registered above, so a new backend's one line adds its name too.
NAMES: tuple[str, ...] = ("auto", *BACKENDS)


def backend(name: str) -> Backend:
    """The backend a choice, a record or a listed box names (the engine's name, "oci", or an OCI runtime's)."""
    return BACKENDS.get(name) or next(b for b in BACKENDS.values() if b.serves(name))


def of_shape(shape: Any) -> Backend | None:
    """The backend a claimer's shape is for, None when it names none (a runtime's carries "backend"; the engine's is the default)."""
    if not isinstance(shape, dict):
        return None
    return BACKENDS.get(str(shape.get("backend", DOCKER.name)))


def launch_for(choice: Choice, engine: DockerBackend | None, ends: Ends, *, session: str, reader_gone: Callable[[], None]) -> Launch:
    """The launch for the backend chosen; the engine's client is imported only for a box on the engine."""
    return backend(choice.backend).launch(choice, engine, ends, session=session, reader_gone=reader_gone)

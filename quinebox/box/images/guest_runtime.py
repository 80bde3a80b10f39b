"""The guest's runtime: a Python with its own loader and libraries, mounted read-only at /.quinebox in every box.

The lifeline, the agent loop and the in-box `quinebox` run from it, so a box's
image may hold any libc, no Python and no shell. It is assembled once in the
agent image (images/runtime.sh) and copied out of it into the state dir, one
directory per agent image, made atomically so concurrent quinebox processes
agree on it. The interpreter is started through its own loader with `-I -S`,
so nothing of the image (its libc, PYTHON* variables, PATH) reaches it; the
image's environment goes, unchanged, to the command the lifeline runs.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from quinebox import untar
from quinebox.box.policy import RUNTIME as MOUNT
from quinebox.errors import ImageError
from quinebox.state import state_dir

if TYPE_CHECKING:
    from quinebox.box.backends.docker.engine import DockerBackend

#: Caps on what is copied out: a runtime is a few thousand files and some tens of megabytes.
MAX_MEMBERS = 100_000
MAX_BYTES = 2 << 30


def runtime_root() -> Path:
    return state_dir() / "runtime"


def runtime_dir(backend: DockerBackend, agent_image: str, *, image_id: str | None = None) -> str:
    """The host directory to mount at /.quinebox, copied out of `agent_image` the first time it is needed.

    `image_id`: the agent image's id when the caller has just inspected it (a box of that image),
    so the engine is not asked twice.
    """
    target = runtime_root() / (image_id or _image_id(backend, agent_image)).split(":")[-1][:16]
    if not (target / "lib" / "ld.so").exists():
        _extract(backend, agent_image, target)
    return str(target)


@functools.lru_cache(maxsize=8)
def _image_id(backend: DockerBackend, agent_image: str) -> str:
    """Asked once per process: a box of any other image needs the agent image's id too."""
    image_id = backend.image_id(agent_image)
    if image_id is None:
        raise ImageError(f"image {agent_image} not found: build it with `quinebox image build` (the guest runtime comes from it)")
    return image_id


def _extract(backend: DockerBackend, image: str, target: Path) -> None:
    """Copy /.quinebox out of `image` into `target`; whoever renames first wins, the others discard theirs."""
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".making-", dir=target.parent))
    try:
        try:
            with backend.archive(image, MOUNT) as stream:
                untar.unpack(stream, scratch, max_members=MAX_MEMBERS, max_bytes=MAX_BYTES)
        except (untar.Refused, untar.Unreadable) as exc:
            raise ImageError(f"image {image}: its guest runtime at {MOUNT} cannot be copied out ({exc}): rebuild it with `quinebox image build`") from None
        made = scratch / MOUNT.lstrip("/")
        if not (made / "lib" / "ld.so").exists():
            raise ImageError(f"image {image} holds no guest runtime at {MOUNT}: rebuild it with `quinebox image build`")
        try:
            os.rename(made, target)
        except OSError:
            if not (target / "lib" / "ld.so").exists():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def prune(backend: DockerBackend, agent_image: str) -> list[str]:
    """Remove runtimes copied out of older agent images that no box still mounts; the names removed."""
    from quinebox.box.backends.docker import box as dockerbox  # the engine's client: only for gc

    root = runtime_root()
    if not root.is_dir():
        return []
    current = runtime_dir(backend, agent_image) if backend.image_id(agent_image) else None
    mounted = {source for box in dockerbox.boxes(backend) for source in box.mounts}
    removed = []
    for path in sorted(root.iterdir()):
        if path.is_dir() and not path.name.startswith(".") and str(path) != current and str(path) not in mounted:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path.name)
    return removed

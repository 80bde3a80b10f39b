"""What every backend's configure step shares: an image's own argv for a spec that gives none (with_argv), and an
image unpacked on this machine for the boxes whose root it is (unpacked_image: an OCI runtime's, a checkpoint's).

Each backend's own step is in its room (backends/docker/configure.py: the engine's container configuration;
backends/oci/configure.py: a runtime's config.json and the box's ids), called by its launch, which starts the
box, and by its seam object for the pool, which works out the shape of the boxes it keeps warm the same way, so
both agree by construction on what a box of a given request looks like.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import TYPE_CHECKING

from quinebox.box.images.lookup import resolve_image
from quinebox.box.policy import NATIVE_INIT
from quinebox.box.spec import DEFAULT_IMAGE, BoxSpec, ImageInfo
from quinebox.errors import EngineError, ErrorKind, GrantError, ImageError

if TYPE_CHECKING:
    pass


def unpacked_image(name: str, *, pull: str) -> tuple[ImageInfo, str]:
    """(the image, its unpacked root): with no engine call once it is unpacked (unless --pull always); with no
    engine to ask, from what root shared (shared.py: a user without the engine's socket) or its registry (registry.py)."""
    from quinebox.box.images import rootfs, shared, usage

    if pull != "always":
        known = rootfs.lookup(name)
        if known is not None:
            root = rootfs.unpacked(known.id)
            if root is not None:
                return known, usage.mark(str(root))
    from quinebox.box.backends.docker.engine import DockerBackend

    try:
        backend = DockerBackend.shared()
        image = resolve_image(backend, name, pull=pull, pullable=name != DEFAULT_IMAGE)
    except EngineError as exc:  # no engine to ask (none here, or not this user's): what root shared, or its registry
        if exc.kind not in (ErrorKind.UNREACHABLE, ErrorKind.TIMEOUT):
            raise  # an engine that answered and refused (or a bug reported as the engine) is itself, not "no engine"
        public = shared.lookup(name) if pull != "always" else None  # shared.py: copied into this user's cache as if pulled
        if public is not None:
            info, tree = public
            made = rootfs.unpack(info, "shared", lambda root: shared.copy_into(root, tree))
            rootfs.remember(info, "shared")
            return info, usage.mark(str(made))
        if name == DEFAULT_IMAGE:
            raise EngineError(f"image {name} is not here, and the engine cannot be asked ({str(exc).rstrip('.')}): or have root share it (`sudo quinebox image share`)",
                              kind=ErrorKind.NOT_FOUND, image=name) from exc
        if pull == "never":
            raise ImageError(f"image {name} is not here: --pull never forbids pulling it, and the engine cannot be asked ({str(exc).rstrip('.')})",
                             kind=ErrorKind.NOT_FOUND, image=name) from exc
        from quinebox.box.images import registry

        image = registry.pull(name, str(exc).rstrip("."))
        return image, usage.mark(str(rootfs.unpacked(image.id)))
    return image, usage.mark(str(rootfs.from_engine(backend, image)))


def with_argv(spec: BoxSpec, image: ImageInfo) -> BoxSpec:
    """A spec with no argv runs its image's entrypoint and command."""
    if spec.argv:
        return spec
    if not image.entrypoint and not image.cmd:
        raise GrantError(f"nothing to run: image {spec.image} has no entrypoint or command; give one, as in `quinebox exec --image {spec.image} -- CMD`")
    return replace(spec, argv=(*image.entrypoint, *image.cmd))


def has_native_init(agent_root: str) -> bool:
    """Whether the guest runtime of the agent image unpacked at `agent_root` holds the native init (policy.NATIVE_INIT),
    which the image's build compiles where a C compiler is (agent_image.native_init)."""
    return os.access(f"{agent_root}{NATIVE_INIT}", os.X_OK)

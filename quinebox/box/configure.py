"""From a checked spec to its container configuration: the image found, the guest runtime in place, the policy applied.

Shared by `BoxProcess`, which starts the box, and the pool, which works out
the shape of the boxes it keeps warm the same way, so both agree by
construction on what a box of a given request looks like.
"""

from __future__ import annotations

from dataclasses import replace

from quinebox.box.backends.docker import DockerBackend
from quinebox.box.images import resolve_image
from quinebox.box.policy import ContainerConfig, container_config, native_arch
from quinebox.box.runtime import runtime_dir
from quinebox.box.spec import DEFAULT_IMAGE, BoxSpec, ImageInfo, seccomp_base
from quinebox.errors import GrantError


def configure(spec: BoxSpec, backend: DockerBackend) -> tuple[BoxSpec, ImageInfo, ContainerConfig]:
    """(the spec, its argv filled from the image when it had none; the image; the container configuration)."""
    ours = spec.image == DEFAULT_IMAGE  # quinebox's own image: never pulled, surely has /bin/sh
    image = resolve_image(backend, spec.image, pull=spec.pull, pullable=not ours)
    if not spec.argv:
        if not image.entrypoint and not image.cmd:
            raise GrantError(f"nothing to run: image {spec.image} has no entrypoint or command; give one, as in `quinebox exec --image {spec.image} -- CMD`")
        spec = replace(spec, argv=(*image.entrypoint, *image.cmd))
    runtime = runtime_dir(backend, DEFAULT_IMAGE, image_id=image.id if ours else None)
    return spec, image, container_config(spec, image=image, runtime=runtime, seccomp=seccomp_base(), arch=native_arch())

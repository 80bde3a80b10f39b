"""The Docker backend's configure step: from a checked spec to the engine's container configuration, the image found
on the engine (pulled where asked) and the guest runtime copied out of the agent image. Ranked at configure's tier
(tests/unit/test_layout.py); what every backend shares (the image's argv, an image unpacked) is box/configure.py's."""

from __future__ import annotations

from typing import TYPE_CHECKING

from quinebox.box.configure import with_argv
from quinebox.box.images.lookup import resolve_image
from quinebox.box.policy import ContainerConfig, container_config, native_arch
from quinebox.box.spec import DEFAULT_IMAGE, HOST_IMAGE, BoxSpec, ImageInfo, seccomp_base
from quinebox.errors import GrantError

if TYPE_CHECKING:
    from quinebox.box.backends.docker.engine import DockerBackend


def configure(spec: BoxSpec, backend: DockerBackend) -> tuple[BoxSpec, ImageInfo, ContainerConfig]:
    """(the spec, its argv filled from the image when it had none; the image; the container configuration)."""
    from quinebox.box.images.guest_runtime import runtime_dir

    if spec.image == HOST_IMAGE:
        raise GrantError("--image host needs an OCI runtime (runc or runsc): the Docker engine cannot root a box in the host's own filesystem; "
                         "use --backend oci (`quinebox doctor` says why it was not chosen)")

    ours = spec.image == DEFAULT_IMAGE  # quinebox's own image: never pulled, surely has /bin/sh
    image = resolve_image(backend, spec.image, pull=spec.pull, pullable=not ours)
    spec = with_argv(spec, image)
    runtime = runtime_dir(backend, DEFAULT_IMAGE, image_id=image.id if ours else None)
    return spec, image, container_config(spec, image=image, runtime=runtime, seccomp=seccomp_base(), arch=native_arch())

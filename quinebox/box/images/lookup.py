"""Finding a box's image: any local image, pulled when missing, for this machine's architecture.

(image.py builds quinebox's own agent image.) What a box takes from its image is
what `docker run` takes: its environment, working directory and default command.

Any local image will do; a missing one is pulled (`--pull missing|always|never`)
with its progress on stderr. The image's architecture must be this machine's:
quinebox runs native code only (its seccomp profile is for one architecture).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from quinebox.box.policy import native_machine
from quinebox.box.spec import ImageInfo
from quinebox.errors import ErrorKind, ImageError

if TYPE_CHECKING:
    from quinebox.box.backends.docker.engine import DockerBackend

Progress = Callable[[str], None]


def resolve_image(backend: DockerBackend, name: str, *, pull: str = "missing", progress: Progress | None = None, pullable: bool = True) -> ImageInfo:
    """The image's config, pulling it first when the policy says so; one clear line when it cannot be had."""
    data = None if pull == "always" and pullable else backend.inspect_image(name)
    if data is None:
        if pull == "never" or not pullable:
            hint = "build it with `quinebox image build`" if not pullable else f"--pull never forbids pulling it: `docker pull {name}` first, or use --pull missing"
            raise ImageError(f"image {name} is not here: {hint}", kind=ErrorKind.NOT_FOUND, image=name)
        say = progress or say_progress
        if sys.stderr.isatty():
            say(f"pulling {name}")
        backend.pull(name, say)
        data = backend.inspect_image(name)
        if data is None:
            raise ImageError(f"image {name} is still not here after pulling it")
    info = ImageInfo.from_inspect(name, data)
    if info.arch != native_machine():
        raise ImageError(f"image {name} is for {info.arch}, and this machine runs {native_machine()}: quinebox runs native images only")
    return info


def say_progress(line: str) -> None:
    print(f"quinebox: {line}", file=sys.stderr, flush=True)

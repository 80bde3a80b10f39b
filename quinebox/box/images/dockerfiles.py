"""Another project's Dockerfile built by the Docker engine, as `quinebox.build_image`: a benchmark task's
environment (Harbor's, Inspect's), then run as any image is, in a hardened box.

The build is the engine's own, with its layer cache and a deadline per request. The tag says what was built
(the Dockerfile's bytes and every file of its context), so a second trial of a task, or the next sample of an
eval, finds the image already there and builds nothing; a changed file is a new tag, never a stale image.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import docker.errors

from quinebox.box.backends.docker.engine import DockerBackend
from quinebox.box.backends.reach import unreachable
from quinebox.errors import EngineError, ImageError, QuineboxError

#: How long one build may take: a task's image may install packages.
BUILD_TIMEOUT = 1800.0
#: The repository built images are tagged in unless the caller names a tag.
REPOSITORY = "quinebox-built"


def content_tag(dockerfile: Path, context: Path) -> str:
    """`quinebox-built:<hash>` of the Dockerfile's bytes and each context file's path, mode and bytes."""
    digest = hashlib.sha256(dockerfile.read_bytes())
    for root, dirs, files in os.walk(context):
        dirs.sort()
        for name in sorted(files):
            path = Path(root, name)
            digest.update(f"\0{path.relative_to(context)}\0{path.lstat().st_mode:o}\0".encode())
            if path.is_file() and not path.is_symlink():
                digest.update(path.read_bytes())
            elif path.is_symlink():
                digest.update(os.readlink(path).encode())
    return f"{REPOSITORY}:{digest.hexdigest()[:20]}"


def build(
    dockerfile: str | os.PathLike[str], context: str | os.PathLike[str] | None = None, *, tag: str | None = None, rebuild: bool = False,
    timeout: float = BUILD_TIMEOUT,
) -> str:
    """Build `dockerfile` (its context: `context`, default its directory) and return the image's tag: `tag`, or one of
    its content (`content_tag`), found without a build when the engine has it already (unless `rebuild`). ImageError when the build
    fails (its last lines of output kept), QuineboxError when there is no such file, EngineError (one line, saying why)
    when no engine answers: the caller adds what its user gives instead."""
    file = Path(dockerfile).resolve()
    where = Path(context).resolve() if context is not None else file.parent
    if not file.is_file():
        raise QuineboxError(f"cannot build {dockerfile}: no such Dockerfile")
    if not where.is_dir():
        raise QuineboxError(f"cannot build {dockerfile}: its context {context} is not a directory")
    name = tag or content_tag(file, where)
    try:
        backend = DockerBackend.connect(timeout=timeout)
    except EngineError as exc:
        why = unreachable()
        reason = why.reason if why else f"cannot be reached ({exc})"
        raise EngineError(f"cannot build {dockerfile}: a Dockerfile is built by the Docker engine, and it {reason}") from exc
    try:
        if tag is None and not rebuild and backend.image_id(name) is not None:
            return name
        relative = os.path.relpath(file, where)
        said: list[str] = []
        try:
            for chunk in backend.api.build(path=str(where), dockerfile=relative, tag=name, rm=True, forcerm=True, decode=True):
                said.append(str(chunk.get("stream") or ""))
                if "error" in chunk:
                    tail = "".join(said).strip()[-2000:]
                    raise ImageError(f"cannot build {dockerfile}: {str(chunk['error']).strip()}" + (f"\n{tail}" if tail else ""))
        except docker.errors.APIError as exc:
            raise ImageError(f"cannot build {dockerfile}: {exc.explanation or exc}") from exc
        return name
    finally:
        backend.close()

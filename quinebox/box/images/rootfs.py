"""Images unpacked once into read-only root filesystems, so that starting a box needs no engine.

An OCI runtime starts a box from a directory, not an image. Each image is
unpacked once per image id, from wherever it comes: the engine's store
(`docker export` of a container created for it and never started, which
flattens its layers for us), a `docker save` tarball or an OCI image layout
(box/images/archives.py, their layers applied by box/images/layers.py). Once unpacked, a box of it costs one
stat and no engine call, so a frozen or stopped engine stops no such box.

    images/<hex of the image id>/rootfs/       the tree, under every box's own root (backends/oci/boxroot.py), never written
    images/<hex of the image id>/image.json    what a box takes from the image (spec.ImageInfo)
    images/<hex of the image id>/seal.json     what the tree held at its unpack (seal.py): one that changed leaves (eviction.py)
    images/<hex of the image id>/used          touched as each box takes the tree (usage.py)
    images/refs/<name, %-quoted>.json          which id a name meant when last unpacked or resolved
    images/.making-<PID-START>-XXXX/           an unpacking under way (or its maker's remains)

`images/` is private to its owner: the tree keeps the image's owners (a file
of uid 1000 would otherwise be writable by the host's uid 1000). An unpacking
is made in a scratch directory and renamed into place, so concurrent first
uses agree and a crash leaves only a scratch directory, which `gc` and `prune`
remove once its maker is dead (eviction.py, which also says which unpacked
images leave the cache, and when). Ids from tarballs and layouts are their config
blob's digest, as Docker computes them, and each layer is checked against
the config's diff ids, so no archive can pass for another image in the cache.

Names: the engine's own table of names (repositories.json, read as a file
when the engine is local and it is readable, no engine call) wins for the
names it holds; a name it has dropped is not served from here either. Where
it cannot be read, refs/ is used: a name re-tagged in the engine keeps its old
id until it is next resolved through the engine (`remember`).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import stat
import tempfile
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING

from quinebox.box.images import seal
from quinebox.box.spec import ImageInfo
from quinebox.errors import ImageError, QuineboxError
from quinebox.processes import owner_tag
from quinebox.state import run_dir, state_dir, unwritable

if TYPE_CHECKING:
    from quinebox.box.backends.docker.engine import DockerBackend

ROOTFS = "rootfs"
IMAGE_JSON = "image.json"
SCRATCH = ".making-"

#: Where a local engine keeps its names (its data root, then `image/<storage driver>/repositories.json`).
DOCKER_ROOT = "/var/lib/docker"
DOCKER_CONFIG = "/etc/docker/daemon.json"
_LOCAL_SOCKETS = ("", "unix:///var/run/docker.sock", "unix:///run/docker.sock")
HEX = re.compile(r"[0-9a-f]{64}")


def images_root() -> Path:
    return state_dir() / "images"


def id_hex(image_id: str) -> str:
    """The 64 hex digits of a `sha256:` image id: the name of its directory."""
    hex_part = image_id.split(":", 1)[1] if image_id.startswith("sha256:") else image_id
    if not HEX.fullmatch(hex_part):
        raise ImageError(f"bad image id {image_id!r}: expected sha256: and 64 hex digits")
    return hex_part


def unpacked(image_id: str) -> Path | None:
    """The image's root filesystem when it is unpacked (one stat: a rootfs/ appears only complete)."""
    path = images_root() / id_hex(image_id) / ROOTFS
    return path if os.path.isdir(path) else None


def in_rootfs(root: str, path: str) -> bool:
    """Whether an unpacked image holds `path`, its links resolved as the box would see them (inside its root:
    busybox's /bin/sh and a merged /usr's /bin are links); only looked at, never opened."""
    parts, hops = [p for p in path.split("/") if p], 0
    seen: list[str] = []
    while parts:
        name = parts.pop(0)
        if name == "..":
            seen = seen[:-1]
            continue
        if name == ".":
            continue
        here = os.path.join(root, *seen, name)
        try:
            info = os.lstat(here)
        except OSError:
            return False
        if stat.S_ISLNK(info.st_mode):
            hops += 1
            if hops > 40:
                return False
            target = os.readlink(here)
            parts = [p for p in target.split("/") if p] + parts
            if target.startswith("/"):
                seen = []
            continue
        seen.append(name)
    return True


def image_info(image_id: str) -> ImageInfo | None:
    """What a box takes from an unpacked image, read from its image.json; None when it is not unpacked."""
    folder = images_root() / id_hex(image_id)
    try:
        return read_image_json(folder)
    except ImageError:
        return None


def read_image_json(folder: Path) -> ImageInfo:
    """The ImageInfo an image's `folder` (here, or in the shared cache) keeps in its image.json.
    ImageError when there is none, or it is not one this code wrote."""
    try:
        doc = json.loads((folder / IMAGE_JSON).read_text())
        return ImageInfo(
            name=doc["name"], id=doc["id"], env=tuple((k, v) for k, v in doc["env"]), workdir=doc["workdir"],
            entrypoint=tuple(doc["entrypoint"]), cmd=tuple(doc["cmd"]), arch=doc["arch"],
        )  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ImageError(f"no image.json of an unpacked image in {folder}: {exc}") from None


def familiar(name: str) -> str:
    """A name as Docker writes it in its table: `busybox` is `busybox:latest`, `docker.io/library/` is left out."""
    for prefix in ("docker.io/library/", "index.docker.io/library/", "docker.io/", "index.docker.io/"):
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    if "@" not in name and ":" not in name.rsplit("/", 1)[-1]:
        name += ":latest"
    return name


def lookup(name: str) -> ImageInfo | None:
    """The unpacked image `name` (a name or an image id) means now, with no engine call; None when there is none."""
    if name.startswith("sha256:"):
        return image_info(name)
    key = familiar(name)
    engine = engine_names()
    ref = _read_ref(key)
    if engine is not None and key in engine:
        image_id = engine[key]
    elif ref is not None and (engine is None or ref.get("source") != "engine"):
        image_id = ref["id"]
    else:
        return None
    info = image_info(image_id)
    return replace(info, name=name) if info else None


def engine_names() -> dict[str, str] | None:
    """The local engine's names → image ids, read from its repositories.json; None when it is not ours to read."""
    if os.environ.get("DOCKER_HOST", "") not in _LOCAL_SOCKETS:
        return None
    root = DOCKER_ROOT
    try:
        with open(DOCKER_CONFIG) as file:
            root = json.load(file).get("data-root") or root
    except (OSError, ValueError, AttributeError):
        pass
    try:
        tables = sorted(Path(root, "image").glob("*/repositories.json"), key=lambda p: p.stat().st_mtime)
        if not tables:
            return None
        global _engine_names
        seen = tables[-1].stat()
        stamp = (str(tables[-1]), seen.st_mtime_ns, seen.st_size)
        if _engine_names is None or _engine_names[0] != stamp:  # read again only once the engine has written it again
            repositories = json.loads(tables[-1].read_text()).get("Repositories") or {}
            _engine_names = stamp, {name: image_id for names in repositories.values() for name, image_id in names.items()}
        return dict(_engine_names[1])
    except (OSError, ValueError, AttributeError):
        return None


#: The engine's names as last read here (a command server reads them before it forks its workers): which table it
#: was, its mtime and size, and the names.
_engine_names: tuple[tuple[str, int, int], dict[str, str]] | None = None


def remember(info: ImageInfo, source: str = "engine") -> None:
    """Record that `info.name` means `info.id` (`source`: engine, docker-archive or oci-layout); written only when it changes."""
    if info.name.startswith("sha256:") or not info.name:
        return
    key = familiar(info.name)
    record = {"name": key, "id": info.id, "source": source}
    if _read_ref(key) == record:
        return
    refs = _root() / "refs"
    try:
        refs.mkdir(exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=refs, prefix=".new-", delete=False) as file:
            json.dump(record, file)
        os.replace(file.name, _ref_path(key))
    except OSError as exc:
        raise ImageError(unwritable(f"the name of image {info.name}", exc)) from None


def _ref_path(key: str) -> Path:
    return images_root() / "refs" / (urllib.parse.quote(key, safe="") + ".json")


def _read_ref(key: str) -> dict[str, str] | None:
    try:
        return json.loads(_ref_path(key).read_text())
    except (OSError, ValueError):
        return None


def refs() -> Iterator[tuple[Path, dict[str, str]]]:
    for path in sorted((images_root() / "refs").glob("*.json")):
        try:
            yield path, json.loads(path.read_text())
        except (OSError, ValueError):
            continue


# -- sources ---------------------------------------------------------------------------------


def from_engine(backend: DockerBackend, info: ImageInfo) -> Path:
    """The rootfs of `info` (as the engine resolved it, see images.resolve_image), exported from the engine the first time."""
    path = unpacked(info.id)
    if path is None:

        def fill(root: Path) -> None:
            from quinebox.box.images.layers import Tree  # tarfile and its compressors: only when an image is unpacked

            tree = Tree(str(root), f"image {info.name}")
            with backend.export_image(info.id) as stream:
                tree.layer(stream, whiteouts=False)
            tree.close()

        path = unpack(info, "engine", fill)
    remember(info, "engine")
    return path


# -- the cache -------------------------------------------------------------------------------


def _root() -> Path:
    root = images_root()
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(root, 0o700)
    except OSError as exc:
        raise ImageError(unwritable("unpacked images", exc)) from None
    return root


def unpack(info: ImageInfo, source: str, fill: Callable[[Path], None]) -> Path:
    """The image's rootfs, made by `fill(path)` (a layers.Tree at path) in a scratch directory renamed into place.

    One maker at a time per image (a lock of its own in run/unpacking/): the boxes that want it first, 16 of a
    `map` at once say, wait for that one rather than each unpacking it. Were two to make it all the same (a lock
    file removed meanwhile by gc), whoever renames first wins; the other discards its own."""
    root = _root()
    final = root / id_hex(info.id)
    if (final / ROOTFS).is_dir():
        return final / ROOTFS
    try:
        locks().mkdir(mode=0o700, parents=True, exist_ok=True)
        lock = open(locks() / id_hex(info.id), "a")
    except OSError as exc:
        raise ImageError(unwritable(f"image {info.name}", exc)) from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / ROOTFS).is_dir():
            return final / ROOTFS
        return _make(info, source, fill, final)


def scratch_dir(what: str) -> Path:
    """A directory of this process's in the cache for making `what` in, named so that `gc` removes it should
    this process die before it does (eviction.tidy)."""
    try:
        return Path(tempfile.mkdtemp(prefix=f"{SCRATCH}{owner_tag()}-", dir=_root()))
    except OSError as exc:
        raise ImageError(unwritable(what, exc)) from None


def _make(info: ImageInfo, source: str, fill: Callable[[Path], None], final: Path) -> Path:
    scratch = scratch_dir(f"image {info.name}")
    try:
        fill(scratch / ROOTFS)
        (scratch / IMAGE_JSON).write_text(json.dumps({**asdict(info), "source": source}, indent=1) + "\n")
        seal.write(scratch, scratch / ROOTFS)
        os.chmod(scratch, 0o755)
        try:
            os.rename(scratch, final)
        except OSError:
            if not (final / ROOTFS).is_dir():
                raise
    except QuineboxError:
        raise
    except OSError as exc:
        raise ImageError(unwritable(f"image {info.name}", exc)) from None
    finally:
        discard(scratch)
    return final / ROOTFS


def locks() -> Path:
    """Where each image's lock is, held while it is unpacked."""
    return run_dir() / "unpacking"


def discard(path: Path) -> None:
    """Remove a tree, its read-only directories included when not running as root."""
    if not os.path.lexists(path):
        return
    shutil.rmtree(path, ignore_errors=True)
    if os.path.lexists(path):
        for top, dirs, _ in os.walk(path):
            for name in dirs:
                try:
                    os.chmod(os.path.join(top, name), 0o700, follow_symlinks=False)
                except OSError:
                    pass
        shutil.rmtree(path, ignore_errors=True)

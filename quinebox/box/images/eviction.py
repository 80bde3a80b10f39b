"""Which unpacked images leave the cache (rootfs.py), and why: the one image step of `gc` and `prune`
(box/owners/gc.py's `prune_images` gives it the images the boxes listed use). Never one a box uses; of the rest:

    stale     no name means its image any more: the engine no longer has it, or its name now means another,
              and no `docker save` tarball or OCI layout loaded here names it (`current_ids`)
    idle      no box has used it for `retention: {images: 30d}` in config.yaml (usage.py)
    changed   its tree is not what its seal says (seal.py), so it is served to no box again

Each is weighed before it goes, so what is said freed was there; with `dry`, each is weighed and none goes.
Besides images, unpacking leaves scratch directories of dead makers, the locks of images no longer unpacked
and names (refs/) that meant only such images: those go too (`tidy`), uncounted. The next box of an image
that went unpacks it afresh.
"""

from __future__ import annotations

import fcntl
from dataclasses import dataclass
from pathlib import Path

from quinebox.box.images import seal, usage
from quinebox.box.images.rootfs import HEX, ROOTFS, SCRATCH, discard, engine_names, id_hex, images_root, locks, refs, unpacked
from quinebox.grants import format_duration
from quinebox.processes import owner_tag, process_start_ticks
from quinebox.state import tree_bytes

STALE = "no name means its image any more (the engine no longer has it, or its name means another now)"


@dataclass(frozen=True)
class Evicted:
    """An unpacked image that left the cache (or, dry, would): its directory's name (the hex of its id), why,
    the bytes its directory held, and when a box last used it."""

    name: str
    why: str
    size: int
    used: float


def evict(in_use: set[str], engine_ids: set[str] | None, *, dry: bool = False) -> list[Evicted]:
    """Remove (with `dry`, only weigh) each unpacked image no box uses (`in_use`: image ids or directory names)
    that is stale, idle or changed, and tidy what unpacking left (not when `dry`). `engine_ids`: the engine's
    images (DockerBackend.image_ids), None with no engine to ask. A bad `retention: {images:}` is refused
    before anything goes."""
    idle = usage.idle_limit()
    busy = {i.split(":", 1)[-1] for i in in_use}
    current = current_ids(engine_ids)
    going = dict.fromkeys(stale(busy, current), STALE)
    if idle is not None:
        for path in usage.unused(images_root(), idle, busy):
            going.setdefault(path, f"no box has used it for {format_duration(idle)} (retention: images in config.yaml)")
    going.update(changed(busy | {path.name for path in going}))
    evicted = []
    for path, why in sorted(going.items()):
        size, used = tree_bytes(path), usage.last_used(path)
        if dry or remove(path):
            evicted.append(Evicted(path.name, why, size, used))
    if not dry:
        tidy(current)
    return evicted


def current_ids(engine_ids: set[str] | None) -> set[str]:
    """The ids some name still means: every tarball's or layout's, and the engine's images (`engine_ids`, from
    DockerBackend.image_ids); with None (no engine to ask), every name's that refs/ or the engine's table holds."""
    ids = {record["id"] for _, record in refs() if engine_ids is None or record.get("source") != "engine"}
    if engine_ids is not None:
        return ids | set(engine_ids)
    return ids | set((engine_names() or {}).values())


def stale(in_use: set[str], current: set[str]) -> list[Path]:
    """The unpacked images no live box uses (`in_use`) and no name means (`current`, see current_ids)."""
    keep = {id_hex(i) for i in in_use | current if HEX.fullmatch(i.split(":", 1)[-1])}
    return [path for path in _image_dirs() if path.name not in keep]


def changed(in_use: set[str]) -> dict[Path, str]:
    """Each unpacked image that changed since its unpack (see seal.py) and that is not `in_use` (directory
    names), and why. One in use is left for a later `gc` or `prune`: its boxes hold it."""
    found = {}
    for path in _image_dirs():
        if path.name in in_use or not (path / ROOTFS).is_dir():
            continue
        why = seal.changed(path, path / ROOTFS)
        if why is not None:
            found[path] = why
    return found


def tidy(current: set[str]) -> None:
    """Remove the scratch directories of dead makers, the locks of images not unpacked (unless one is being
    unpacked now), and the names that meant only images no longer unpacked (none `current` means)."""
    root = images_root()
    if not root.is_dir():
        return
    for path in sorted(root.glob(f"{SCRATCH}*")):
        pid, _, rest = path.name[len(SCRATCH) :].partition("-")
        if not (pid.isdigit() and process_start_ticks(int(pid)) == rest.partition("-")[0]):
            discard(path)
    for path in sorted(locks().glob("*")):
        if not (root / path.name).exists():
            try:
                with open(path, "a") as lock:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    path.unlink()
            except OSError:
                pass
    for path, record in refs():
        image_id = str(record.get("id", ""))
        if image_id not in current and (not HEX.fullmatch(image_id.split(":", 1)[-1]) or unpacked(image_id) is None):
            path.unlink(missing_ok=True)


def remove(path: Path) -> bool:
    """Remove an unpacked image: out of sight first (a box never finds half a tree); a crash mid-way leaves a dead
    maker's scratch directory, which `tidy` removes."""
    gone = path.parent / f"{SCRATCH}{owner_tag()}-gone-{path.name}"
    try:
        path.rename(gone)
    except OSError:
        return False
    discard(gone)
    return True


def _image_dirs() -> list[Path]:
    root = images_root()
    return sorted(path for path in root.iterdir() if HEX.fullmatch(path.name)) if root.is_dir() else []

"""The objects no world names any more leave the store: the last step of `quinebox prune` (tree/prune.py).

An object is named by a revision of some world under sessions/, a kept session's or one of a box that was
never indexed (an exec's, a Sandbox's) alike. What no revision names yet, but an open world has put and is
about to name, is spared by the store's leases (ObjectStore in revisions.py): the sweep takes `sweep.lock`
exclusively, so no put runs meanwhile, and spares every object touched since the oldest live lease began.
"""

from __future__ import annotations

import fcntl
import os
import time
from dataclasses import dataclass
from pathlib import Path

from quinebox.documents import json_objects
from quinebox.worlds.revisions import ObjectStore


@dataclass
class Swept:
    """What a sweep took (or, dry, would take)."""

    objects: int = 0
    bytes: int = 0


def objects_of(sessions: Path, without: frozenset[str] = frozenset()) -> dict[str, dict[str, int]]:
    """For each world under `sessions` (those of `without`, about to be pruned, left out): the objects its
    revisions name, and their sizes.

    A log that cannot be read whole names what its readable lines name: a line being appended is an open
    world's, whose objects its lease spares."""
    found: dict[str, dict[str, int]] = {}
    try:
        entries = list(os.scandir(sessions))
    except FileNotFoundError:
        return found
    for entry in entries:
        if entry.name in without:
            continue
        try:
            data = (Path(entry.path) / "world" / "revisions.jsonl").read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            continue
        names = found[entry.name] = {}
        for revision in json_objects(data.split(b"\n")[:-1]):
            changes = revision.get("changes")
            for e in changes.values() if isinstance(changes, dict) else ():
                if isinstance(e, dict) and isinstance(e.get("sha"), str):
                    names[e["sha"]] = int(e.get("size") or 0)
    return found


def named(sessions: Path, without: frozenset[str] = frozenset()) -> set[str]:
    """Every object a revision under `sessions` names, the worlds of `without` left out."""
    return {sha for names in objects_of(sessions, without).values() for sha in names}


def floor(store: ObjectStore) -> float:
    """When the oldest live lease began (now, when none is): objects touched since then are spared. Called under
    the exclusive lock; a lease nobody holds is a world that closed, and goes."""
    oldest = time.time()
    try:
        leases = list(os.scandir(store.root / "leases"))
    except FileNotFoundError:
        return oldest
    for lease in leases:
        try:
            fd = os.open(lease.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                oldest = min(oldest, os.fstat(fd).st_mtime)
                continue
            os.unlink(lease.path)
        finally:
            os.close(fd)
    return oldest


def sweep(store: ObjectStore, sessions: Path, *, without: frozenset[str] = frozenset(), dry: bool = False) -> Swept:
    """Remove (with `dry`, only count) each object no revision under `sessions` names, bar those of `without`,
    and that no live world may be about to name."""
    swept = Swept()
    lock = store.locked(fcntl.LOCK_EX)
    try:
        spare_since = floor(store)
        keep = named(sessions, without)
        for fan in _fans(store.root):
            for item in os.scandir(fan):
                if fan.name + item.name in keep:
                    continue
                st = item.stat(follow_symlinks=False)
                if st.st_mtime >= spare_since:
                    continue
                if not dry:
                    os.unlink(item.path)
                swept.objects += 1
                swept.bytes += st.st_size
    finally:
        os.close(lock)
    return swept


def _fans(root: Path) -> list[Path]:
    """The store's two-hex-digit directories (not tmp/ or leases/)."""
    try:
        return [Path(e.path) for e in os.scandir(root) if len(e.name) == 2 and e.is_dir(follow_symlinks=False) and all(c in "0123456789abcdef" for c in e.name)]
    except FileNotFoundError:
        return []

"""What an unpacked image held when it was unpacked, to tell later whether anything has changed it since.

Every box of an image starts from the same tree (rootfs.py), read-only in the box and the lower layer of each
box's own root (backends/oci/boxroot.py), so nothing of quinebox's writes it after its unpack. Something else could:
a tool run as root on the host, an older quinebox that let the runtime make mount points in it, a disk restored
from a backup. Such a tree must not be served to the next box as if it were the image.

A seal is one digest over every entry's relative name and lstat — type and mode, owner, size, mtime and ctime —
walked in sorted order, and the count of entries. ctime is set by the kernel alone: writing, truncating,
chmod, chown, renaming, linking or touching an entry changes its ctime, and adding or removing an entry changes
its directory's, so no change made through the file system goes unseen, however its maker sets the mtimes.
Only metadata is read (one lstat per entry, ~150 ms for quinebox's own image of ~6,700 entries), so `gc` can
check every image each time; a box's start checks nothing (it would cost as much), the layering keeps it clean.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

SEAL = "seal.json"
VERSION = 1


def digest(root: str | Path) -> tuple[int, str]:
    """(how many entries `root` holds, their digest), the root's own lstat included; links are never followed."""
    sha = hashlib.sha256()
    count = 0
    pending = [""]
    while pending:
        rel = pending.pop()
        here = os.path.join(root, rel)
        _add(sha, rel or ".", os.lstat(here))
        with os.scandir(here) as listing:
            entries = sorted(listing, key=lambda e: e.name)
        for entry in entries:
            name = os.path.join(rel, entry.name)
            if entry.is_dir(follow_symlinks=False):
                pending.append(name)  # its lstat is added when it is walked
            else:
                _add(sha, name, entry.stat(follow_symlinks=False))
            count += 1
    return count, sha.hexdigest()


def _add(sha: hashlib._Hash, name: str, info: os.stat_result) -> None:
    sha.update(os.fsencode(name) + b"\0")
    sha.update(f"{info.st_mode:o} {info.st_uid} {info.st_gid} {info.st_size} {info.st_mtime_ns} {info.st_ctime_ns}\n".encode())


def write(image_dir: Path, root: Path) -> None:
    """Seal the tree `root` of the image in `image_dir`, as it is now: right after its unpack, before any box has it."""
    count, sha = digest(root)
    (image_dir / SEAL).write_text(json.dumps({"version": VERSION, "entries": count, "sha256": sha}) + "\n")


def changed(image_dir: Path, root: Path) -> str | None:
    """Why the tree `root` is no longer what its seal says, in a few words; None when it is."""
    try:
        sealed = json.loads((image_dir / SEAL).read_text())
        entries, sha = int(sealed["entries"]), str(sealed["sha256"])
    except FileNotFoundError:
        return "it has no seal (unpacked by a quinebox that let boxes write their mount points into it)"
    except (OSError, ValueError, KeyError, TypeError):
        return "its seal cannot be read"
    try:
        now, now_sha = digest(root)
    except OSError as exc:
        return f"it cannot be walked ({exc.strerror})"
    if now != entries:
        return f"it holds {now} entries, {entries} when it was unpacked"
    return None if now_sha == sha else "its entries' names, modes, owners, sizes or times differ from its unpack's"

"""Making a recorded world real: beneath a directory on the host (`carry_out`), or as a tar stream (`exported`).

Both make every entry the history can make again and name the rest (`unkept`);
neither ever writes through a link or makes a device node.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Mapping

from quinebox.worlds import beneath
from quinebox.worlds.revisions import CHUNK, NODES, Entry, Manifest, ObjectStore, unkept


def exported(manifest: Manifest, store: ObjectStore, out) -> list[str]:
    """Write `manifest` as a tar stream to `out` (a binary file), owned by the caller; `path (why)` for each entry left out."""
    import tarfile

    skipped = []
    uid, gid = os.getuid(), os.getgid()
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(manifest):
            entry = manifest[path]
            info = tarfile.TarInfo(path)
            info.uid, info.gid = uid, gid
            if why := unkept(entry) or ("a socket, which a tar archive cannot hold" if entry["type"] == "s" else None):
                skipped.append(f"{path} ({why})")
            elif entry["type"] in ("d", "p"):
                info.type, info.mode = tarfile.DIRTYPE if entry["type"] == "d" else tarfile.FIFOTYPE, entry["mode"]
                tar.addfile(info)
            elif entry["type"] == "l":
                info.type, info.linkname = tarfile.SYMTYPE, entry["target"]
                tar.addfile(info)
            elif entry["type"] == "f":
                info.mode, info.size, info.mtime = entry["mode"], entry["size"], entry.get("mtime", 0) // 10**9
                with store.open(entry["sha"]) as data:
                    tar.addfile(info, data)
    return skipped


def carry_out(
    delta: Mapping[str, Entry | None],
    store: ObjectStore,
    root_fd: int,
    *,
    uid: int | None = None,
    gid: int | None = None,
    hide: Callable[[int, str, str], None] | None = None,
) -> list[str]:
    """Make `delta` true beneath `root_fd`: deletions deepest first, then parents before children,
    directory modes last (so a read-only directory can still be filled). `hide(dir_fd, name, path)`
    runs after each deletion (an overlay layer must hide what lies below it). Returns `path (why)`
    for each entry that cannot be made again (`unkept`), left as it was.
    """
    for path in sorted((p for p, e in delta.items() if e is None), key=lambda p: -p.count("/")):
        try:
            parent, name = beneath.open_parent(root_fd, path)
        except FileNotFoundError:
            continue
        try:
            beneath.remove(parent, name)
            if hide is not None:
                hide(parent, name, path)
        finally:
            os.close(parent)
    skipped = []
    owner = (uid, gid) if uid is not None and gid is not None and os.getuid() == 0 else None
    made = {p: e for p, e in delta.items() if e is not None}
    for path in sorted(made, key=lambda p: (p.count("/"), p)):
        entry = made[path]
        parent, name = beneath.open_parent(root_fd, path, create=True)
        try:
            if entry["type"] == "d":
                try:
                    is_dir = stat.S_ISDIR(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode)
                except FileNotFoundError:
                    is_dir = False
                if not is_dir:
                    beneath.remove(parent, name)
                    os.mkdir(name, 0o700, dir_fd=parent)
            elif entry["type"] == "l":
                beneath.remove(parent, name)
                os.symlink(entry["target"], name, dir_fd=parent)
            elif why := unkept(entry):
                skipped.append(f"{path} ({why})")
                continue
            elif entry["type"] in NODES:
                beneath.remove(parent, name)
                os.mknod(name, NODES[entry["type"]] | 0o600, dir_fd=parent)
                os.chmod(name, entry["mode"], dir_fd=parent, follow_symlinks=False)
            else:
                write_file(parent, name, store, entry)
            if owner:
                os.chown(name, *owner, dir_fd=parent, follow_symlinks=False)
        finally:
            os.close(parent)
    for path in sorted((p for p, e in made.items() if e["type"] == "d"), key=lambda p: -p.count("/")):
        parent, name = beneath.open_parent(root_fd, path)
        try:
            os.chmod(name, made[path]["mode"], dir_fd=parent, follow_symlinks=False)
        finally:
            os.close(parent)
    return skipped


def write_file(dir_fd: int, name: str, store: ObjectStore, entry: Entry) -> None:
    """A regular file from the store, replacing whatever `name` was (never writing through a link)."""
    beneath.remove(dir_fd, name)
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    with os.fdopen(fd, "wb") as out, store.open(entry["sha"]) as data:
        while chunk := data.read(CHUNK):
            out.write(chunk)
        os.fchmod(out.fileno(), entry["mode"])
    mtime = entry.get("mtime")
    if mtime:
        os.utime(name, ns=(mtime, mtime), dir_fd=dir_fd, follow_symlinks=False)


"""A world's history: content-addressed objects, manifests, and a log of changes.

A manifest maps each world-relative path to an entry — `{"type": "f", "mode",
"size", "sha", "mtime"}` for a file, `"d"` for a directory, `"l"` with a
`target` for a symlink, `"p"` and `"s"` with a `mode` for a FIFO and a socket,
`"c"` and `"b"` with an `rdev` for a device node. A revision stores only what
changed since the one before (`{path: entry or null}`), and file contents live
once in the state dir's object store, named by their SHA-256; so a revision
costs what changed, not what the world holds. Every kind of entry is recorded,
so that going back to a revision removes whatever came after it; what cannot be
made again (a device node, a file whose bytes were not kept) is named wherever
that is attempted (`unkept`). Setuid and setgid bits are never recorded.

Overlay layers use two more entry kinds while they are read: `"w"`, a
whiteout (the path was deleted above a lower layer), and `"opaque": true` on a
directory that hides everything below it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import secrets
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from quinebox.errors import ErrorKind, QuineboxError
from quinebox.state import SEALED_MODE, private_dir, private_file, session_dir, state_dir
from quinebox.worlds import beneath

Entry = dict[str, Any]
Manifest = dict[str, Entry]
Changes = dict[str, "Entry | None"]



def max_entries() -> int:
    """A world may hold at most this many entries; a scan stops there rather than grow without bound.

    Settings are read when used, not at import: a command server's worker runs with its client's environment."""
    return int(os.environ.get("QUINEBOX_WORLD_MAX_ENTRIES", "200000"))


def max_file() -> int:
    """Larger files are listed (size and all) but their bytes are not kept."""
    return int(os.environ.get("QUINEBOX_WORLD_MAX_FILE", str(1 << 30)))

OPAQUE = "user.overlay.opaque"
CHUNK = 1 << 20
#: The special files a world's history makes again (empty, as a restarted program would find them).
NODES = {"p": stat.S_IFIFO, "s": stat.S_IFSOCK}


class WorldError(QuineboxError):
    """A world operation that cannot be done as asked: too large, unknown revision, unsafe archive."""


class ConflictError(WorldError):
    """A child's changes meet the parent's own since the fork; the caller decides (`--force`)."""

    exit_code = 1
    default_kind = ErrorKind.CONFLICT


def mode_bits(st: os.stat_result) -> int:
    return stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID)


def unkept(entry: Entry) -> str | None:
    """Why `entry` cannot be made again from the history; None when it can."""
    if entry["type"] == "f" and entry.get("sha") is None:
        return "its bytes were not kept: larger than QUINEBOX_WORLD_MAX_FILE, or unreadable when recorded"
    if entry["type"] in ("c", "b"):
        return "a device node, which quinebox never makes"
    return None


def unkept_entries(manifest: Manifest) -> list[str]:
    """`path (why)` for each entry of `manifest` that cannot be made again."""
    return [f"{path} ({why})" for path, entry in sorted(manifest.items()) if (why := unkept(entry))]


class ObjectStore:
    """File contents by SHA-256, shared by every world in the state dir: identical bytes are kept once.

    `quinebox prune` takes the objects no revision names (worlds/sweep.py). So that it never takes one a world
    is about to name: each put holds `sweep.lock` shared (the sweep holds it exclusive), an object found already
    there is touched, and each open world holds a lease from before its first put (`lease`); the sweep spares
    every object touched since the oldest live lease began.

    Its dirs are 0700 and each object 0400 (state.py): a world's files are the user's alone, whatever the umask."""

    def __init__(self, root: Path | None = None):
        self.root = root or state_dir() / "objects"

    def locked(self, how: int) -> int:
        """An fd of `sweep.lock` holding `how` (fcntl.LOCK_SH or LOCK_EX); the caller closes it to let go."""
        private_dir(self.root)
        fd = private_file(self.root / "sweep.lock", os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, how)
        return fd

    def lease(self) -> int:
        """A lease for a world opening now: a file in leases/, its mtime now, held locked until the returned fd is
        closed. Made under `sweep.lock`, so that a sweep never sees one not yet locked and takes it for dead."""
        swept = self.locked(fcntl.LOCK_SH)
        try:
            leases = self.root / "leases"
            private_dir(leases)
            fd = private_file(leases / f"{os.getpid()}-{secrets.token_hex(4)}", os.O_RDWR | os.O_CREAT | os.O_EXCL)
            fcntl.flock(fd, fcntl.LOCK_SH)
            return fd
        finally:
            os.close(swept)

    def path(self, sha: str) -> Path:
        if len(sha) != 64 or not all(c in "0123456789abcdef" for c in sha):
            raise WorldError(f"bad object name {sha!r}", kind=ErrorKind.CORRUPT, object=sha)
        return self.root / sha[:2] / sha[2:]

    def put(self, dir_fd: int, name: str) -> tuple[str, int] | None:
        """Copy a regular file in, hashing as it goes: (its SHA-256, its size), or None when it is over max_file().

        No more is read than its size when opened, so a file the box keeps growing costs what it held then (its
        next change is read again), and the size recorded is always the bytes kept: a restore plan and an
        export stream exactly that many."""
        fd = beneath.open_file(dir_fd, name)
        try:
            swept = self.locked(fcntl.LOCK_SH)
        except BaseException:
            os.close(fd)
            raise
        try:
            return self._put(fd)
        finally:
            os.close(swept)

    def _put(self, fd: int) -> tuple[str, int] | None:
        tmp_dir = self.root / "tmp"
        private_dir(tmp_dir)
        digest = hashlib.sha256()
        out = tempfile.NamedTemporaryFile(dir=tmp_dir, delete=False)
        try:
            with os.fdopen(fd, "rb") as src, out:
                left = os.fstat(fd).st_size
                if left > max_file():
                    return None
                total = 0
                while left > 0 and (chunk := src.read(min(CHUNK, left))):
                    total += len(chunk)
                    left -= len(chunk)
                    digest.update(chunk)
                    out.write(chunk)
            sha = digest.hexdigest()
            final = self.path(sha)
            if final.exists():
                os.utime(final)  # named again: a sweep under way before the next revision names it spares it
                return sha, total
            private_dir(final.parent)
            os.chmod(out.name, SEALED_MODE)
            os.replace(out.name, final)
            return sha, total
        finally:
            if os.path.exists(out.name):
                os.unlink(out.name)

    def open(self, sha: str):  # -> BinaryIO
        return open(self.path(sha), "rb")


class Scanner:
    """Reads a directory tree (a world, or one overlay layer of it) into manifest entries, beneath its root."""

    def __init__(self, store: ObjectStore, previous: Manifest, *, layer: bool = False, limit: int | None = None):
        self.store = store
        self.previous = previous
        self.layer = layer
        self.limit = max_entries() if limit is None else limit
        self.count = 0

    def entry(self, dir_fd: int, name: str, rel: str, st: os.stat_result, *, fresh: bool) -> Entry:
        """`fresh`: hash the file even if its size and mtime say it is unchanged (it was seen changing)."""
        self.count += 1
        if self.count > self.limit:
            raise WorldError(
                f"the world holds more than {self.limit} entries; revisions stop there (remove files, or raise QUINEBOX_WORLD_MAX_ENTRIES)",
                kind=ErrorKind.LIMIT, limit=self.limit,
            )
        if stat.S_ISREG(st.st_mode):
            old = self.previous.get(rel)
            size = st.st_size
            if not fresh and old and old["type"] == "f" and old["size"] == st.st_size and old.get("mtime") == st.st_mtime_ns:
                sha = old["sha"]
            elif st.st_size > max_file():
                sha = None
            else:
                try:
                    kept = self.store.put(dir_fd, name)
                except PermissionError:
                    kept = None  # the box made it unreadable: listed, its bytes not kept
                sha, size = kept if kept is not None else (None, size)
            return {"type": "f", "mode": mode_bits(st), "size": size, "sha": sha, "mtime": st.st_mtime_ns}
        if stat.S_ISDIR(st.st_mode):
            entry: Entry = {"type": "d", "mode": mode_bits(st)}
            if self.layer and self._opaque(dir_fd, name):
                entry["opaque"] = True
            return entry
        if stat.S_ISLNK(st.st_mode):
            return {"type": "l", "target": os.readlink(name, dir_fd=dir_fd)}
        if stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode):
            return {"type": "p" if stat.S_ISFIFO(st.st_mode) else "s", "mode": mode_bits(st)}
        if self.layer and stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
            return {"type": "w"}
        return {"type": "c" if stat.S_ISCHR(st.st_mode) else "b", "mode": mode_bits(st), "rdev": st.st_rdev}

    @staticmethod
    def _opaque(dir_fd: int, name: str) -> bool:
        try:
            fd = os.open(name, beneath.DIR_FLAGS, dir_fd=dir_fd)
        except OSError:
            return False
        try:
            return os.getxattr(fd, OPAQUE) == b"y"
        except OSError:
            return False
        finally:
            os.close(fd)

    def walk(self, root_fd: int, top: str = "", *, fresh: bool = False) -> Iterator[tuple[str, Entry]]:
        """Every entry below `top` (not `top` itself), depth first, never through a symlink."""
        for _, fd, entries in beneath.walk(root_fd, top):
            for rel, item in entries:
                try:
                        entry = self.entry(fd, item.name, rel, item.stat(follow_symlinks=False), fresh=fresh)
                except (FileNotFoundError, beneath.Escape):
                    continue
                yield rel, entry


def scan(root: str, store: ObjectStore, previous: Manifest | None = None, *, layer: bool = False) -> Manifest:
    """The whole tree under `root`; unchanged files (same size and mtime as in `previous`) are not reread."""
    fd = os.open(root, beneath.DIR_FLAGS)
    try:
        return dict(Scanner(store, previous or {}, layer=layer).walk(fd))
    finally:
        os.close(fd)


def below(manifest: Manifest, path: str) -> list[str]:
    prefix = path + "/"
    return [p for p in manifest if p.startswith(prefix)]


def merge(base: Manifest, layer: Manifest) -> Manifest:
    """What an overlay shows: `layer` over `base`, with its whiteouts and opaque directories."""
    merged = dict(base)
    for path in sorted(layer, key=lambda p: p.count("/")):
        entry = layer[path]
        old = merged.get(path)
        # Only a directory below has anything under it; a whiteout, a non-directory or an opaque directory hides it.
        if old and old["type"] == "d" and (entry["type"] != "d" or entry.get("opaque")):
            for sub in below(merged, path):
                if sub not in layer:
                    del merged[sub]
        if entry["type"] == "w":
            merged.pop(path, None)
        else:
            merged[path] = {k: v for k, v in entry.items() if k != "opaque"}
    return merged


def changes(old: Manifest, new: Manifest) -> Changes:
    out: Changes = {p: e for p, e in new.items() if old.get(p) != e}
    out.update({p: None for p in old if p not in new})
    return out


def apply(manifest: Manifest, delta: Changes) -> Manifest:
    result = dict(manifest)
    for path, entry in delta.items():
        if entry is None:
            result.pop(path, None)
        else:
            result[path] = entry
    return result


def describe(old: Manifest, delta: Changes) -> list[tuple[str, str]]:
    """(A|M|D, path) for each change, parents before children."""
    out = []
    for path in sorted(delta):
        entry = delta[path]
        if entry is None:
            out.append(("D", path))
        elif path not in old:
            out.append(("A", path))
        elif entry.get("type") != "d" or old[path].get("type") != "d":
            out.append(("M", path))
    return out


class RevisionLog:
    """A world's revisions, one JSON line each, appended and fsynced: `sessions/<id>/world/revisions.jsonl` (0600).
    A world made empty appends its rev 0 unsynced (World): the next append's fsync makes it durable with it."""

    def __init__(self, session: str):
        self.session = session
        self.path = session_dir(session) / "world" / "revisions.jsonl"
        self._lock = threading.Lock()

    def records(self) -> list[dict[str, Any]]:
        """Every complete record; a line still being appended (no newline yet) is not one."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in data.split(b"\n")[:-1] if line.strip()]

    def append(self, record: dict[str, Any], *, sync: bool = True) -> dict[str, Any]:
        """`record` as the log's last line, fsynced unless `sync` is False."""
        record = {"t": round(time.time(), 3), **record}
        line = json.dumps(record, separators=(",", ":")).encode() + b"\n"
        with self._lock:
            private_dir(self.path.parent)
            with open(private_file(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab") as f:
                f.write(line)
                f.flush()
                if sync:
                    os.fsync(f.fileno())
        return record

    def manifest(self, rev: int | None = None) -> Manifest:
        """The world as it was at `rev` (default: the latest)."""
        records = self.records()
        if not records:
            raise WorldError(f"session {self.session} has no world revisions", kind=ErrorKind.NOT_FOUND, session=self.session)
        last = records[-1]["rev"]
        if rev is None:
            rev = last
        if not 0 <= rev <= last:
            raise WorldError(f"session {self.session} has no revision {rev}: its revisions are 0 to {last}", kind=ErrorKind.NOT_FOUND, session=self.session, rev=rev, last=last)
        base = records[0].get("base")
        manifest = RevisionLog(base["session"]).manifest(base["rev"]) if base else {}
        for record in records[: rev + 1]:
            manifest = apply(manifest, record["changes"])
        return manifest


def new_bytes(delta: Changes) -> int:
    return sum(e.get("size", 0) for e in delta.values() if e and e["type"] == "f")

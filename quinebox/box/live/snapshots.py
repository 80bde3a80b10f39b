"""Snapshots of long-lived boxes as they lie in the state dir: their files, their sealed manifests, whose they are.

    snapshots/<id>/manifest.json   what the snapshot holds and how a copy of its box is made, sealed (below)
    snapshots/<id>/image/          runsc's checkpoint: memory, processes, open files, every tmpfs (/tmp, /dev/shm)
    snapshots/<id>/world/          the box's /world at the same instant (none when its /world is a tmpfs: the image
                                   holds that)
    snapshots/<id>.making/         one being made, its maker's owner id in `maker`; `gc` removes it once that is gone
    snapshots/.keys/<uid>          the key each user seals their manifests with (0600, in a dir of theirs, 0700:
                                   another's, a link, or one open to others is refused, never used)

A snapshot is its maker's: its directory is theirs (0700), its manifest names their uid, and the manifest — every
file with its SHA-256, the box's recipe — is sealed with an HMAC under their key. Restoring checks all of it and
reads every file again first: another user's snapshot, or one changed since it was made (a file, the manifest,
its uid), is refused in one line, and nothing is started.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import os
import shutil
import stat
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from quinebox.box.spec import new_session_id
from quinebox.errors import QuineboxError, StateError
from quinebox.processes import owner_alive, owner_id
from quinebox.state import snapshots_dir

VERSION = 1
MANIFEST = "manifest.json"
#: Where a snapshot being made is, and who makes it.
MAKING, MAKER = ".making", "maker"
KEYS = ".keys"
CHUNK = 1 << 20


@dataclass(frozen=True)
class Recipe:
    """How a copy of the box is made: the original's image (which must be the same image still: a copy's processes
    go on with its files) and grants, as they were resolved when it was made (its time limit aside: each copy has
    its own), and whether its /world is a world of its own (the snapshot's world/, copied into each copy's)."""

    image: str
    #: The image's id, and the agent image's (whose guest runtime, at /.quinebox, the box's init runs).
    image_id: str
    agent_id: str
    grants: tuple[str, ...]
    ask: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    ask_timeout: float | None = None
    workdir: str | None = None
    world: bool = True
    runtime: str = "runsc"


@dataclass(frozen=True)
class Snapshot:
    id: str
    uid: int
    #: The session of the box it was taken of, and the process that took it.
    box: str
    made_by: str
    created: float
    recipe: Recipe
    #: Every file of the snapshot (its path below the snapshot's directory) and its SHA-256.
    files: dict[str, str] = field(default_factory=dict)
    size: int = 0
    #: A fork's: removed once its copies are made (by `gc`, should its maker die first).
    transient: bool = False
    version: int = VERSION

    @property
    def path(self) -> Path:
        return snapshots_dir() / self.id


def _user_key() -> bytes:
    """This user's sealing key, made the first time. Whoever could plant it, or read it, could seal a manifest as
    this user: the keys' dir must be this user's and no one else's to enter, and the key a regular file of theirs
    that no one else may read or write, opened never through a link; anything else is refused in one line
    (StateError) naming the path and the fix, and nothing is sealed or restored."""
    keys = snapshots_dir() / KEYS
    keys.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        os.mkdir(keys, 0o700)
        os.chmod(keys, 0o700)  # made here: its mode is the umask's no more
    except FileExistsError:
        pass
    _private(keys, os.lstat(keys), stat.S_ISDIR, "dir of snapshot keys")
    path = keys / str(os.getuid())
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "wb") as out:
            os.fchmod(fd, 0o600)
            out.write(os.urandom(32))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)  # a planted FIFO would block a read
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StateError(f"the snapshot key {path} is a symbolic link, which quinebox never reads through: remove it (what it sealed cannot be restored)") from None
        raise
    with os.fdopen(fd, "rb") as key:
        _private(path, os.fstat(fd), stat.S_ISREG, "snapshot key")
        return key.read()


def _private(path: Path, info: os.stat_result, kind: Callable[[int], bool], what: str) -> None:
    """StateError unless `info` is of `kind`, this user's, and no one else's to read, write or enter."""
    me = os.geteuid()
    if not kind(info.st_mode):
        raise StateError(f"the {what} {path} is of the wrong kind (not made by quinebox): remove it (what it sealed cannot be restored)")
    if info.st_uid != me:
        raise StateError(f"the {what} {path} is uid {info.st_uid}'s, not yours (uid {me}): remove it (what it sealed cannot be restored)")
    if info.st_mode & 0o077:
        raise StateError(f"the {what} {path} is open to others (mode {stat.S_IMODE(info.st_mode):04o}): `chmod go= {path}`")


def _canonical(fields: dict[str, Any]) -> bytes:
    return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


def seal(manifest: Snapshot, key: bytes) -> dict[str, Any]:
    """The manifest as written: its fields and their HMAC under `key`."""
    fields = asdict(manifest)
    return {**fields, "seal": hmac.new(key, _canonical(fields), hashlib.sha256).hexdigest()}


def unseal(sealed: Any, key: bytes, name: str) -> Snapshot:
    """The manifest `sealed` holds, if `key` sealed it as it is; else QuineboxError naming snapshot `name`."""
    if not isinstance(sealed, dict) or not isinstance(sealed.get("seal"), str):
        raise QuineboxError(f"snapshot {name} has no sealed manifest: it was not made by quinebox, or not finished")
    fields = {k: v for k, v in sealed.items() if k != "seal"}
    if fields.get("uid") != os.getuid():
        raise QuineboxError(f"snapshot {name} was made by another user (uid {fields.get('uid')}): only they may use it")
    if not hmac.compare_digest(sealed["seal"], hmac.new(key, _canonical(fields), hashlib.sha256).hexdigest()):
        raise QuineboxError(f"snapshot {name} is not as it was made: its manifest was changed (or sealed under another key); it is refused")
    if fields.get("version") != VERSION:
        raise QuineboxError(f"snapshot {name} was made by another version of quinebox (its format {fields.get('version')}, this one's {VERSION})")
    try:
        recipe = dict(fields["recipe"])
        for listed in ("grants", "ask", "deny"):
            recipe[listed] = tuple(recipe[listed])
        return Snapshot(**{**fields, "recipe": Recipe(**recipe)})
    except (TypeError, KeyError, ValueError) as exc:
        raise QuineboxError(f"snapshot {name} has a manifest this quinebox cannot read ({exc})") from None


def digests(root: Path) -> dict[str, str]:
    """Every entry below `root` but the manifest, by its path there: a file's SHA-256 and mode, a link's target's
    SHA-256, a directory's mode. Anything else is no snapshot's, and refused."""
    found = {}
    for directory, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted([*dirs, *files]):
            path = Path(directory, name)
            relative = str(path.relative_to(root))
            if relative in (MANIFEST, MAKER):
                continue
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                found[relative] = "link " + hashlib.sha256(os.fsencode(os.readlink(path))).hexdigest()
            elif stat.S_ISDIR(info.st_mode):
                found[relative] = f"dir {stat.S_IMODE(info.st_mode):o}"
            elif stat.S_ISREG(info.st_mode):
                with open(path, "rb") as data:
                    found[relative] = f"{hashlib.file_digest(data, 'sha256').hexdigest()} {stat.S_IMODE(info.st_mode):o}"
            else:
                raise QuineboxError(f"snapshot {root.name} holds {relative}, which is no file, link or directory: it is refused")
    return found


def size_of(root: Path) -> int:
    """The bytes of the files below `root` (links never followed)."""
    return sum(os.lstat(os.path.join(directory, name)).st_size for directory, _, files in os.walk(root) for name in files)


# -- making one -------------------------------------------------------------------------------


def start() -> tuple[str, Path]:
    """A new snapshot's id and the directory it is made in (`commit` finishes it, `discard` drops it)."""
    snapshot = new_session_id()
    root = snapshots_dir()
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    making = root / f"{snapshot}{MAKING}"
    making.mkdir(mode=0o700)
    (making / MAKER).write_text(owner_id())
    return snapshot, making


def commit(making: Path, manifest: Snapshot) -> Snapshot:
    """The snapshot made in `making` sealed (its files' digests taken now) and put in its place."""
    (making / MAKER).unlink()  # a making one with no maker goes at `gc` a minute on, should this not finish
    done = replace(manifest, files=digests(making), size=size_of(making))
    (making / MANIFEST).write_text(json.dumps(seal(done, _user_key())))
    os.rename(making, done.path)
    return done


def discard(making: Path) -> None:
    shutil.rmtree(making, ignore_errors=True)


# -- finding, checking, removing ------------------------------------------------------------------


def manifest_of(path: Path) -> Snapshot:
    """The sealed manifest of the snapshot at `path`, checked as this user's (not its files: `verify`)."""
    if path.stat().st_uid != os.getuid():
        raise QuineboxError(f"snapshot {path.name} was made by another user (uid {path.stat().st_uid}): only they may use it")
    try:
        sealed = json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        sealed = None
    except (OSError, ValueError):
        raise QuineboxError(f"snapshot {path.name} is not as it was made: its manifest cannot be read; it is refused") from None
    return unseal(sealed, _user_key(), path.name)


def find(ref: str) -> Snapshot:
    """The snapshot whose id is or starts with `ref` (a path to one is taken too), checked as this user's."""
    path = Path(ref)
    if "/" not in ref:
        root = snapshots_dir()
        matches = sorted(p for p in root.glob(f"{ref}*") if p.is_dir() and not p.name.endswith(MAKING) and not p.name.startswith(".")) if ref and root.is_dir() else []
        if len(matches) != 1:
            said = "no snapshot" if not matches else "more than one snapshot"
            raise QuineboxError(f"{said} has an id starting {ref!r}: `quinebox box snapshots` lists them")
        path = matches[0]
    if not path.is_dir():
        raise QuineboxError(f"no snapshot at {ref}: `quinebox box snapshots` lists them")
    return manifest_of(path)


def verify(manifest: Snapshot) -> None:
    """Every file of the snapshot as its manifest says, read again now; QuineboxError naming the first that is not."""
    found = digests(manifest.path)
    for name in sorted(set(found) | set(manifest.files)):
        if found.get(name) != manifest.files.get(name):
            what = "is missing" if name not in found else "was added" if name not in manifest.files else "was changed"
            raise QuineboxError(f"snapshot {manifest.id} is not as it was made: {name} {what}; it is refused")


def listing() -> list[Snapshot]:
    """This user's snapshots, oldest first; one that cannot be read as theirs is left out (`gc` says why)."""
    root = snapshots_dir()
    found = []
    for path in sorted(root.iterdir()) if root.is_dir() else ():
        if not path.is_dir() or path.name.startswith(".") or path.name.endswith(MAKING):
            continue
        try:
            found.append(manifest_of(path))
        except (QuineboxError, OSError):
            continue
    return sorted(found, key=lambda m: m.created)


def remove(manifest: Snapshot) -> None:
    shutil.rmtree(manifest.path)


def sweep() -> list[str]:
    """What `gc` removes of this user's: snapshots left half made by a process that is gone, and forks' own
    whose maker is gone. Returns their ids."""
    root = snapshots_dir()
    gone = []
    for path in sorted(root.iterdir()) if root.is_dir() else ():
        if path.name.startswith(".") or not path.is_dir() or path.stat().st_uid != os.getuid():
            continue
        if path.name.endswith(MAKING):
            try:
                maker = (path / MAKER).read_text()
            except OSError:
                maker = ""
            if maker and owner_alive(maker) or not maker and time.time() - path.stat().st_mtime < 60:
                continue
        else:
            try:
                manifest = manifest_of(path)
            except (QuineboxError, OSError):
                continue
            if not manifest.transient or owner_alive(manifest.made_by):
                continue
        shutil.rmtree(path, ignore_errors=True)
        gone.append(path.name.removesuffix(MAKING))
    return gone

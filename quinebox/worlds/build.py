"""Making a world on the host: its directories, filled from a recorded revision, host copies or an archive.

Everything here either finishes or leaves nothing behind; `discard` removes a
world that will not be used.

A world is the user's alone whatever the umask (state.py): its dirs are made
0700 and meta.json 0600, and the layer the box writes to is 0700 too, owned by
the box's uid and gid when root makes it (the box's user keeps every right on
it; no one else has any). What the box puts in it keeps the modes it gave.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import stat
from typing import Any

from quinebox import untar
from quinebox.errors import ErrorKind
from quinebox.state import DIR_MODE, private_dir, private_write, session_dir
from quinebox.worlds import beneath
from quinebox.worlds.materialize import carry_out
from quinebox.worlds.revisions import ObjectStore, RevisionLog, WorldError
from quinebox.worlds.spec import WorldSpec, world_dir

#: An archive may hold at most this many members and bytes (before anything is written).
MAX_ARCHIVE_MEMBERS = 200_000
#: Linux's FICLONE ioctl (linux/fs.h): the target shares the source's blocks until either is written.
FICLONE = 0x40049409
#: What FICLONE answers where blocks cannot be shared: another filesystem, or one without reflinks (ext4, tmpfs).
NO_CLONE = frozenset({errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS})


def max_archive_bytes() -> int:
    """Read when used, not at import: a command server's worker runs with its client's environment."""
    return int(os.environ.get("QUINEBOX_WORLD_MAX_ARCHIVE", str(8 << 30)))


def create(session: str, spec: WorldSpec, uid: int, gid: int) -> None:
    """Make the world's directories and fill them; on any failure nothing is left behind."""
    here = world_dir(session)
    private_dir(here)
    try:
        if spec.kind == "overlay":
            for path in (spec.layer, spec.work):
                if path is None:
                    raise WorldError(f"world {session}: an overlay world has no work directory")
                _mkdir(path)
                _own(path, uid, gid)
        elif spec.kind == "dir":
            _make_layer(spec)
            _fill(spec, uid, gid)
            _own(spec.layer, uid, gid)
        private_write(here / "meta.json", json.dumps({"session": session, "uid": uid, "gid": gid, **_spec_fields(spec)}).encode())
    except BaseException:
        discard(session)
        raise


def hand_over(session: str, spec: WorldSpec, uid: int, gid: int) -> None:
    """A world that goes on in a new box (a resumed session's) made the new box's user's: what its earlier box's
    user owned (a root-made box's host ids are its tree's own, and a new box has others: box/backends/oci/idmap.py)
    is given to `uid`:`gid`, walking without following links, and meta.json says so. Only root gives files away."""
    _, meta = load_spec(session)
    old = (meta.get("uid"), meta.get("gid"))
    if os.getuid() != 0 or old == (uid, gid):
        return
    for top in (spec.layer, spec.work):
        if top is None or not os.path.isdir(top):
            continue
        for path in [top, *(os.path.join(d, n) for d, dirs, files in os.walk(top) for n in dirs + files)]:
            st = os.lstat(path)
            owner = (uid if st.st_uid == old[0] else st.st_uid, gid if st.st_gid == old[1] else st.st_gid)
            if owner != (st.st_uid, st.st_gid):
                os.chown(path, *owner, follow_symlinks=False)
    private_write(world_dir(session) / "meta.json", json.dumps({**meta, "uid": uid, "gid": gid}).encode())


def _make_layer(spec: WorldSpec) -> None:
    """A dir world's directory; one already there is taken only when empty and meant to stay empty:
    a warm box's world, moved into its session when the box was claimed (box/pool/claim.py), made private then."""
    try:
        _mkdir(spec.layer)
    except FileExistsError:
        if spec.base or spec.sources or spec.archive or os.listdir(spec.layer):
            raise WorldError(f"cannot make a world at {spec.layer}: something is there already") from None
        os.chmod(spec.layer, DIR_MODE)


def _mkdir(path: str) -> None:
    """A layer the box writes to, 0700 whatever the umask (then owned by the box's user: `_own`)."""
    os.mkdir(path, DIR_MODE)
    os.chmod(path, DIR_MODE)


def _spec_fields(spec: WorldSpec) -> dict[str, Any]:
    return {"kind": spec.kind, "layer": spec.layer, "lowers": list(spec.lowers), "work": spec.work, "base": list(spec.base) if spec.base else None}


def _own(path: str, uid: int, gid: int) -> None:
    if os.getuid() == 0:
        os.chown(path, uid, gid)


def _fill(spec: WorldSpec, uid: int, gid: int) -> None:
    fd = os.open(spec.layer, beneath.DIR_FLAGS)
    try:
        if spec.base:
            manifest = RevisionLog(spec.base[0]).manifest(spec.base[1])
            if spec.paths:
                manifest = {p: e for p, e in manifest.items() if any(p == k or p.startswith(k + "/") or k.startswith(p + "/") for k in spec.paths)}
            carry_out(manifest, ObjectStore(), fd, uid=uid, gid=gid)
        for source in spec.sources:
            target = os.path.join(spec.layer, os.path.basename(source))
            if os.path.isdir(source) and not os.path.islink(source):
                shutil.copytree(source, target, symlinks=True, copy_function=_copy)
            else:
                _copy(source, target)
        if spec.archive:
            import_archive(spec.archive, spec.layer)
        if os.getuid() == 0 and (spec.sources or spec.archive):
            for dirpath, dirnames, filenames in os.walk(spec.layer):
                for name in dirnames + filenames:
                    os.chown(os.path.join(dirpath, name), uid, gid, follow_symlinks=False)
    finally:
        os.close(fd)


def _copy(source: str, target: str) -> None:
    """One host entry into a world: a FIFO or socket is made anew (never opened), a device node refused."""
    st = os.lstat(source)
    kind = stat.S_IFMT(st.st_mode)
    if kind in (stat.S_IFIFO, stat.S_IFSOCK):
        os.mknod(target, kind | 0o600)
        os.chmod(target, stat.S_IMODE(st.st_mode), follow_symlinks=False)
    elif kind in (stat.S_IFCHR, stat.S_IFBLK):
        raise WorldError(f"refused {source}: a device node cannot be part of a world; leave it out of --world-from")
    else:
        copy_file(source, target)


def copy_file(source: str, target: str) -> None:
    """A file copied as `shutil.copy2` copies it (a link as a link; mode and times kept), but copy-on-write where
    the filesystem can (btrfs, XFS, bcachefs: FICLONE): a world copied from another, a snapshot's world and each
    copy of a fork then share their blocks until one of them writes, and a copy takes no time for its size."""
    if stat.S_ISREG(os.lstat(source).st_mode) and _cloned(source, target):
        shutil.copystat(source, target, follow_symlinks=False)
    else:
        shutil.copy2(source, target, follow_symlinks=False)


def _cloned(source: str, target: str) -> bool:
    """Whether `target` now shares `source`'s blocks; False where the filesystem cannot (then it is copied)."""
    src = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)  # never blocks: it was a file when looked at
    try:
        dst = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.fchmod(dst, 0o600)  # whatever the umask: where it cannot be cloned, copy2 opens it again to write it
            fcntl.ioctl(dst, FICLONE, src)
            return True
        except OSError as exc:
            if exc.errno in NO_CLONE:
                return False
            raise
        finally:
            os.close(dst)
    finally:
        os.close(src)


def import_archive(archive: str, into: str) -> None:
    """Unpack a tar archive into the directory `into`, refusing it whole if any member is unsafe.

    quinebox/untar.py checks every header before anything is written (absolute
    and `../` names, links that lead out, device files and FIFOs, the caps on
    members and bytes) and clears set-uid bits and ownership, on every Python.
    """
    try:
        untar.unpack(archive, into, max_members=MAX_ARCHIVE_MEMBERS, max_bytes=max_archive_bytes())
    except untar.Refused as exc:
        kind = ErrorKind.LIMIT if isinstance(exc, untar.TooLarge) else ErrorKind.REFUSED
        raise WorldError(f"refused archive {archive}: {exc}", kind=kind, archive=archive) from None
    except untar.Unreadable as exc:
        raise WorldError(f"bad archive {archive}: {exc}", kind=ErrorKind.CORRUPT, archive=archive) from None


def discard(session: str) -> None:
    shutil.rmtree(world_dir(session), ignore_errors=True)
    try:
        session_dir(session).rmdir()  # a command's session holds nothing else
    except OSError:
        pass


def load_spec(session: str) -> tuple[WorldSpec, dict[str, Any]]:
    try:
        meta = json.loads((world_dir(session) / "meta.json").read_text())
    except FileNotFoundError:
        raise WorldError(f"session {session} has no world (a scratch world, or one already removed)", kind=ErrorKind.NOT_FOUND, session=session) from None
    spec = WorldSpec(kind=meta["kind"], layer=meta["layer"], lowers=tuple(meta["lowers"]), work=meta["work"], base=tuple(meta["base"]) if meta["base"] else None)
    return spec, meta

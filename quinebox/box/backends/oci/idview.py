"""An idmapped view of an image's tree: its owners 0… seen as a box's own ids 0…, for the lower layer of a
writable root (`rootfs:rw`, boxroot.py) in a box root makes with ids of its own (idmap.py).

The image's tree is unpacked once, owned by the host's ids (root's, mostly), which the box's user namespace does
not map: in the box its files are nobody's, and not even the box's root could change one. A writable root should
be the image as a container of the engine's sees it, its root-owned files the box's root's. Chowning a copy per
box would cost the image's size each time; an idmapped mount (Linux ≥ 5.12, as podman's and systemd-nspawn's
--userns=auto use them) shows the same tree with each owner shifted into the box's range, and overlayfs takes it
as a lower layer (≥ 5.19): nothing on disk changes owner, the cache is never written, and the view is a detached
mount held by an fd, gone when the fd closes once the overlay holds it.

Such a view makes every file the host's root owns in it the box's root's, so it is made of nothing but an unpacked
image tree of quinebox's own cache (`image_tree`), never of the host's `/` or any other directory: it fails closed.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import subprocess
import time
from pathlib import Path

from quinebox.box.backends.oci import idmap
from quinebox.errors import EngineError
from quinebox.state import state_dir

#: The new mount API: x86-64's and arm64's numbers alike.
SYS_OPEN_TREE, SYS_MOUNT_SETATTR = 428, 442
OPEN_TREE_CLONE, AT_RECURSIVE, AT_EMPTY_PATH, O_CLOEXEC = 0x1, 0x8000, 0x1000, 0o2000000
MOUNT_ATTR_RDONLY, MOUNT_ATTR_IDMAP = 0x1, 0x100000

_libc = ctypes.CDLL(None, use_errno=True)


#: An unpacked image's tree in the cache, below the state dir's images/ (images/rootfs.py: <id's hex>/rootfs).
_IMAGE_TREE = re.compile(r"[0-9a-f]{64}/rootfs")


def image_tree(image_root: str) -> str:
    """`image_root`, resolved, when it is an unpacked image tree of this state dir's cache; EngineError otherwise."""
    resolved = os.path.realpath(image_root)
    cache = os.path.realpath(state_dir() / "images")
    relative = os.path.relpath(resolved, cache)
    if not _IMAGE_TREE.fullmatch(relative) or not Path(resolved).is_dir():
        raise EngineError(f"refused an idmapped view of {image_root}: only an unpacked image tree of quinebox's cache ({cache}) becomes a box root's own")
    return resolved


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _namespace_of(ids: idmap.IdRange) -> int:
    """An fd of a user namespace mapping ids 0… onto `ids`, as the box's own will: a helper unshares one, the host's
    root writes its maps, and the fd keeps it once the helper is gone."""
    helper = subprocess.Popen(["unshare", "--user", "cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        own, deadline = os.readlink("/proc/self/ns/user"), time.monotonic() + 5
        while os.readlink(f"/proc/{helper.pid}/ns/user") == own:
            if helper.poll() is not None or time.monotonic() > deadline:
                raise OSError(errno.EPERM, "cannot make a user namespace for it (unshare --user)", "/proc/self/ns/user")
            time.sleep(0.0005)
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{helper.pid}/{name}", "w") as f:
                f.write(f"0 {ids.first} {ids.span}\n")
        return os.open(f"/proc/{helper.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        if helper.stdin is not None:
            helper.stdin.close()
        try:
            helper.wait(timeout=5)
        except subprocess.TimeoutExpired:
            helper.kill()
            helper.wait()


def idmapped(image_root: str, ids: idmap.IdRange) -> int:
    """A detached, read-only view of the image's tree in which its owner 0… are the box's ids 0… (the host's
    first…), as an fd: the lower layer of a writable root, whose files the box's root then owns as the image's
    root does. Nothing on disk changes; the view goes when its last fd closes. Of an image tree only (`image_tree`)."""
    fd = _libc.syscall(SYS_OPEN_TREE, -100, image_tree(image_root).encode(), OPEN_TREE_CLONE | AT_RECURSIVE | O_CLOEXEC)
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), image_root)
    try:
        userns = _namespace_of(ids)
        try:
            attr = _MountAttr(MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY, 0, 0, userns)
            if _libc.syscall(SYS_MOUNT_SETATTR, fd, b"", AT_EMPTY_PATH | AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr)) != 0:
                code = ctypes.get_errno()
                raise OSError(code, os.strerror(code), image_root)
        finally:
            os.close(userns)
    except BaseException:
        os.close(fd)
        raise
    return int(fd)

"""A bwrap box's copy-on-write world (an agent's child's /world): the overlay of its parent's layers, mounted by the
host in a mount namespace of that box's own, which bwrap then binds at /world.

bwrap 0.8 has no overlay mount, so the process that becomes bwrap mounts it first: a small step exec'd before
the box's starter (quinebox-boxstart, or prlimit) and bwrap (`mounter`, Python with no site and no environment, only for a box with such a world; the pid
stays the one Popen made, so `--die-with-parent`, the info and block fds and the cgroup placement are bwrap's as
ever). It

1. enters a new mount namespace (a plain user: also a new user namespace mapping only their own uid and gid onto
   themselves, setgroups denied: unprivileged overlayfs in a user namespace, with `userxattr`, since Linux 5.11),
   makes every mount in it private, so nothing of it propagates back to the host;
2. mounts the overlay (policy.world_mount's options, nosuid and nodev) on `target`, an empty directory its bwrap
   may walk to (a root-made box's slot, `<slot>/<session>.mnt/world`, 0711 above it; a plain user's own state dir);
3. as root, drops to the box's own unprivileged host ids (no supplementary group; the kernel clears every
   capability as the last uid 0 goes), then execs the rest of its argv: the starter, bwrap.

Its upper layer is then written as on runc: what the box makes is its user's host ids' (as root, its own ids; as a
plain user, theirs), a deletion is overlay's whiteout (a 0:0 character device) and an emptied directory opaque
(`user.overlay.opaque`), which worlds/ reads as the child's changes. As on runc, a root-made box's overlay is
mounted by the host's root (its whiteouts root's); a plain user's by that user in their namespace.

The host keeps no mount of it: it lives in the namespace of that one process, and bwrap's own copy in the box's;
the directory it was mounted on is removed as soon as bwrap has made the box's mounts (removing it detaches what is
mounted on it in other namespaces; /world is a bind of its own). A holder killed by SIGKILL leaves no mount: the
namespace goes with the last of its processes; the empty directory goes with the box's remains.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

#: Run by `python -S -I -c`: argv[1:] is MODE ("root" or "user"), TARGET, OPTIONS, UID, GID, "--", then the command.
#: Any failure is one line on the box's stderr and exit 125, before bwrap runs (bwrap's info fd then says nothing).
_PROGRAM = r"""
import ctypes, os, sys
mode, target, options, uid, gid, _, *argv = sys.argv[1:]
uid, gid = int(uid), int(gid)
libc = ctypes.CDLL(None, use_errno=True)
def fail(what, code):
    os.write(2, ("quinebox: cannot mount the box's /world (an overlay of its parent's layers): %s: %s\n" % (what, os.strerror(code))).encode())
    os._exit(125)
def check(result, what):
    if result != 0:
        fail(what, ctypes.get_errno())
try:
    if mode == "user":
        check(libc.unshare(0x10000000 | 0x20000), "a user and mount namespace")
        for name, text in (("setgroups", "deny"), ("uid_map", "%d %d 1" % (uid, uid)), ("gid_map", "%d %d 1" % (gid, gid))):
            with open("/proc/self/" + name, "w") as f:
                f.write(text)
    else:
        check(libc.unshare(0x20000), "a mount namespace")
    check(libc.mount(b"none", b"/", None, 0x4000 | 0x40000, None), "making its mounts private")
    check(libc.mount(b"overlay", os.fsencode(target), b"overlay", 0x2 | 0x4, os.fsencode(options)), target)
    if mode == "root":
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    os.execv(argv[0], argv)
except OSError as exc:
    fail(exc.filename or "its ids", exc.errno or 0)
"""


def mounter(options: Sequence[str], target: str, host_ids: tuple[int, int], *, as_root: bool) -> list[str]:
    """The argv put before the starter's and bwrap's: mounts the overlay of `options` on `target` in a mount namespace of
    its own (module docstring), then runs the rest as `host_ids` (as root: dropped to them; a plain user: their own)."""
    return [sys.executable, "-S", "-I", "-c", _PROGRAM, "root" if as_root else "user", target, ",".join(options), str(host_ids[0]), str(host_ids[1]), "--"]

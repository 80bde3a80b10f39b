"""Boxes for a user who is not root: whether this machine lets them have one, and the cgroup that holds them.

A rootless box is a runtime run by the user, in a user namespace of the box's own (oci.policy.Rootless). What it
needs of the machine, each told apart here because each has its own fix:

- user namespaces: not switched off (`user.max_user_namespaces` 0, Debian's old `kernel.unprivileged_userns_clone`
  0) nor kept from unconfined programs (Ubuntu 24.04's `kernel.apparmor_restrict_unprivileged_userns` 1);
- a cgroup of the user's own, for the box's memory, pids and cpu limits. On cgroup v2 that is the subtree
  systemd delegates to the user's manager (`user@UID.service`), which the user's own processes lie in, as v2
  requires of whoever moves a process. On v1 (and a hybrid hierarchy, v1 controllers beside v2) systemd
  delegates none, so `quinebox setup-user NAME`, run once by root, makes `quinebox.user-UID` in each controller
  the box needs and gives it to the user (as systemd's Delegate= does); it lasts until the machine restarts.

A box is never started weaker: without either, every runtime way says why in one line, and its fix.

gVisor's runsc (Debian's, 2022-12-19) runs a rootless box, but makes the box's mount points in the root it is
given (`--overlay2` or not), which for a rootless box must be the image's tree itself (no overlay of the
host's can be mounted for it, and runsc takes none at `/` from the config): each box would write its grants'
mount points into every later box of that image. So it is refused here in one line (RUNSC), never run so.
"""

from __future__ import annotations

import os
import pwd
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from quinebox.box.backends.oci.policy import Rootless
from quinebox.errors import ErrorKind, QuineboxError
from quinebox.processes import user_name

CGROUP_ROOT = Path("/sys/fs/cgroup")
MOUNTS = "/proc/self/mounts"
#: What v1 must delegate for a box to run at all: its limits live there. `setup-user` delegates every v1
#: hierarchy there is (cpuset, systemd's name=systemd…), as a runtime joins each it finds (runc makes its
#: cpuset, runsc its name=systemd); what a child may have of a hierarchy is never more than its parent's.
V1_NEEDED = ("memory", "pids", "cpu")
#: What a v1 cpuset child starts without, and is refused tasks until given: its parent's cpus and memory nodes.
CPUSET_COPIED = ("cpuset.cpus", "cpuset.mems")
#: What a v2 subtree must offer: the box's memory and pids limits (cpu too, when granted: refused by the runtime).
V2_NEEDED = ("memory", "pids")
SYSCTLS = {
    "max_user_namespaces": "/proc/sys/user/max_user_namespaces",
    "unprivileged_userns_clone": "/proc/sys/kernel/unprivileged_userns_clone",
    "apparmor_restrict_unprivileged_userns": "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
}


@dataclass(frozen=True)
class Refusal:
    reason: str
    fix: str


#: Why runsc is not a rootless runtime here, and what to do instead (see above).
RUNSC = Refusal(
    "gVisor's runsc, run without root, makes each box's mount points in the image's own tree (it takes no overlay for the box's root)",
    "use runc (the default) for rootless boxes, or run quinebox as root for gVisor",
)


def refusal(runtime: str, who: Rootless | Refusal | None) -> Refusal | None:
    """Why the runtime `runtime` (a name or path) cannot make boxes for `who` (this_user's answer; None for
    root), or None when it can, as far as this machine says before a probe box is tried."""
    if isinstance(who, Refusal):
        return who
    if who is not None and os.path.basename(runtime) == "runsc":
        return RUNSC
    return None


def delegated_name(uid: int) -> str:
    """What `setup-user` names the cgroup it delegates to `uid`: not `quinebox-*`, which is a box's (gc.py)."""
    return f"quinebox.user-{uid}"


def userns_refusal(sysctl: Callable[[str], str | None]) -> Refusal | None:
    """Why this kernel would not give an unprivileged user a user namespace (`sysctl(name)`: its value, or None
    where the kernel has no such setting), or None."""
    if sysctl("max_user_namespaces") == "0":
        return Refusal("user namespaces are switched off (user.max_user_namespaces = 0)", "sudo sysctl -w user.max_user_namespaces=15000")
    if sysctl("unprivileged_userns_clone") == "0":
        return Refusal("unprivileged user namespaces are switched off (kernel.unprivileged_userns_clone = 0)", "sudo sysctl -w kernel.unprivileged_userns_clone=1")
    if sysctl("apparmor_restrict_unprivileged_userns") == "1":
        return Refusal(
            "AppArmor keeps unprivileged programs from user namespaces (kernel.apparmor_restrict_unprivileged_userns = 1, as Ubuntu 24.04 ships)",
            "give runc an AppArmor profile that allows userns (/etc/apparmor.d/runc: `profile runc /usr/sbin/runc flags=(unconfined) { userns, }`), "
            "or sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0",
        )
    return None


def v2_delegated(own_cgroup: str, uid: int, owner: Callable[[str], int | None], controllers: Callable[[str], set[str]]) -> str | None:
    """The v2 subtree systemd delegates to `uid` that this process lies in (`own_cgroup`: its /proc/self/cgroup
    path), when it is the user's and offers V2_NEEDED to its children; else None. `owner(path)`/`controllers(path)`
    read the cgroup at `path` (relative to the v2 root)."""
    parts = own_cgroup.strip("/").split("/")
    for depth in range(len(parts), 0, -1):
        path = "/" + "/".join(parts[:depth])
        if parts[depth - 1] == f"user@{uid}.service":
            return path if owner(path) == uid and set(V2_NEEDED) <= controllers(path) else None
    return None


def v1_delegated(uid: int, owner: Callable[[str], int | None]) -> str | None:
    """`/quinebox.user-UID` when each V1_NEEDED controller has it and it is `uid`'s (`owner(controller/path)`)."""
    path = "/" + delegated_name(uid)
    return path if all(owner(f"{controller}{path}") == uid for controller in V1_NEEDED) else None


def no_cgroup(name: str, hierarchy: str) -> Refusal:
    if hierarchy == "v2":
        return Refusal(
            f"no cgroup v2 subtree is delegated to {name}: this process is not in a systemd user manager's (user@UID.service) subtree",
            f"run quinebox in {name}'s own login session, or `sudo loginctl enable-linger {name}` and `systemd-run --user --scope quinebox …`",
        )
    return Refusal(
        f"no cgroup is delegated to {name} for boxes' limits ({hierarchy} cgroups: systemd delegates none)",
        f"sudo quinebox setup-user {name}  (once; again after a restart)",
    )


def subordinate(text: str, name: str, uid: int) -> tuple[int, int] | None:
    """The first range /etc/subuid's (or subgid's) `text` gives the user `name` (or `uid`): (first id, count)."""
    for line in text.splitlines():
        fields = line.strip().split(":")
        if len(fields) == 3 and fields[0] in (name, str(uid)) and fields[1].isdigit() and fields[2].isdigit() and int(fields[2]) > 0:
            return int(fields[1]), int(fields[2])
    return None


def _sysctl(name: str) -> str | None:
    try:
        return Path(SYSCTLS[name]).read_text().strip()
    except OSError:
        return None


def _owner(path: str) -> int | None:
    try:
        return os.stat(CGROUP_ROOT / path.lstrip("/")).st_uid
    except OSError:
        return None


def _controllers(path: str) -> set[str]:
    try:
        return set((CGROUP_ROOT / path.lstrip("/") / "cgroup.controllers").read_text().split())
    except OSError:
        return set()


def _own_v2_cgroup() -> str:
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return ""
    return next((line[3:] for line in lines if line.startswith("0::")), "")


def _ids_file(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def cgroup_hierarchy(mounts: str) -> str:
    """"v2", "hybrid" (v1 controllers, v2 beside them at /sys/fs/cgroup/unified) or "v1", from /proc/self/mounts' text."""
    kinds = {(fields[1], fields[2]) for fields in (line.split() for line in mounts.splitlines()) if len(fields) > 2}
    if ("/sys/fs/cgroup", "cgroup2") in kinds:
        return "v2"
    has_v1 = any(kind == "cgroup" for _, kind in kinds)
    has_v2 = any(kind == "cgroup2" for _, kind in kinds)
    return "hybrid" if has_v1 and has_v2 else "v1" if has_v1 else "v2" if has_v2 else "none"


def local_hierarchy() -> str:
    """This machine's cgroup hierarchy (cgroup_hierarchy), "none" when its mounts cannot be read."""
    try:
        with open(MOUNTS) as mounts:
            return cgroup_hierarchy(mounts.read())
    except OSError:
        return "none"


def local_rootless() -> Rootless | Refusal | None:
    """For a user who is not root: their boxes' Rootless, or why they may have none here; for root, None."""
    return None if os.geteuid() == 0 else this_user(local_hierarchy())


def this_user(hierarchy: str) -> Rootless | Refusal:
    """For the user running this process: what its boxes are (a Rootless), or why it may have none here."""
    uid, gid = os.getuid(), os.getgid()
    name = user_name(uid)
    refused = userns_refusal(_sysctl)
    if refused is not None:
        return refused
    cgroup = v2_delegated(_own_v2_cgroup(), uid, _owner, _controllers) if hierarchy == "v2" else v1_delegated(uid, _owner)
    if cgroup is None:
        return no_cgroup(name, hierarchy)
    subuid = subgid = None
    if shutil.which("newuidmap") and shutil.which("newgidmap"):  # runc maps a range only through them
        subuid, subgid = subordinate(_ids_file("/etc/subuid"), name, uid), subordinate(_ids_file("/etc/subgid"), name, uid)
        if subuid is None or subgid is None:
            subuid = subgid = None
    return Rootless(uid=uid, gid=gid, cgroup=cgroup, subuid=subuid, subgid=subgid)


#: What of a v1 cgroup systemd's Delegate= hands over, and so `setup_user`: its directory (to make boxes' cgroups
#: below it) and the files that move processes into it. Its limits and weights stay root's: a delegated user
#: sets its own boxes' limits, in the sub-cgroups it makes, never the subtree's own against the rest of the
#: machine (its cpu.shares, its memory.limit_in_bytes).
DELEGATED_FILES = ("cgroup.procs", "tasks")


def setup_user(name: str, hierarchy: str) -> list[str]:
    """As root: delegate `name` the cgroup its boxes need (each v1 hierarchy's `quinebox.user-UID`, with its
    DELEGATED_FILES, as systemd's Delegate= does); the lines that say what was done. On v2 nothing is made:
    systemd delegates the user's manager a subtree, which `this_user` finds. A file another setup gave the
    user (every one of them, before) is given back to root."""
    try:
        user = pwd.getpwnam(name)
    except KeyError:
        raise QuineboxError(f"no user named {name!r} on this machine (`getent passwd {name}`)", kind=ErrorKind.NOT_FOUND, user=name) from None
    if user.pw_uid == 0:
        raise QuineboxError("root needs no delegated cgroup: its boxes are made by root", kind=ErrorKind.BAD_INPUT, user=name)
    if hierarchy == "v2":
        return [f"cgroup v2: systemd delegates {name}'s user manager a subtree (user@{user.pw_uid}.service); boxes started in {name}'s login session use it"]
    done = []
    for base in v1_hierarchies():
        path = base / delegated_name(user.pw_uid)
        path.mkdir(exist_ok=True)
        for copied in CPUSET_COPIED:
            if (base / copied).exists() and not (path / copied).read_text().strip():
                (path / copied).write_text((base / copied).read_text())
        for entry in path.iterdir():
            if not entry.is_dir():  # a box's own cgroup inside (a directory) is the user's already
                owner = (user.pw_uid, user.pw_gid) if entry.name in DELEGATED_FILES else (0, 0)
                os.chown(entry, *owner)
        os.chown(path, user.pw_uid, user.pw_gid)
        done.append(base.name)
    missing = [c for c in V1_NEEDED if c not in done]
    if missing:
        raise QuineboxError(f"this machine has no {' or '.join(missing)} cgroup controller: boxes' limits need it", kind=ErrorKind.UNSUPPORTED, missing=missing)
    return [
        f"delegated to {name} (uid {user.pw_uid}): {CGROUP_ROOT}/{{{','.join(done)}}}/{delegated_name(user.pw_uid)} "
        f"(its directory, cgroup.procs and tasks; its own limits stay root's); boxes of {name}'s now run without root"
    ]


def v1_hierarchies(mounts: str | None = None) -> list[Path]:
    """Every v1 cgroup hierarchy mounted under /sys/fs/cgroup (from /proc/self/mounts' text), by its directory."""
    if mounts is None:
        mounts = Path("/proc/self/mounts").read_text()
    found = [Path(fields[1]) for fields in (line.split() for line in mounts.splitlines()) if len(fields) > 2 and fields[2] == "cgroup"]
    return sorted(path for path in found if path.parent == CGROUP_ROOT)

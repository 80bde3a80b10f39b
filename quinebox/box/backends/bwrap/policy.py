"""The box policy.py describes, as a `bwrap` command line (Debian's bubblewrap 0.8), and its seccomp filter as BPF.

A pure function beside oci.policy.oci_config, rendering the same decisions control by control from the same
inputs (constants, `box_mounts`, `full_environment`, `seccomp_profile`), so a table test can hold the two side by
side. What bwrap holds itself:

- every namespace of its own (`--unshare-all`, the user namespace asked for outright: `--uid`/`--gid` need it),
  the network's too: only `lo`, egress through the host socket as on runc;
- no capability in any set (`--cap-drop ALL`), NoNewPrivs (bwrap sets it for every sandbox it makes), quinebox's
  seccomp profile compiled to BPF by libseccomp (`compile_seccomp`, handed over `--seccomp FD`);
- the box's root made of the image's unpacked tree read-only, never writing it (root.py: a small tmpfs at /, the
  image's entries bound back read-only, the mount points the image lacks made on tmpfs), made read-only once its
  mounts are made (`--remount-ro`), as runc remounts its root;
- /proc (nosuid, noexec, nodev) with the masked paths that exist here covered and the read-only ones read-only;
  /dev bwrap's own (null zero full random urandom tty, a new devpts), then read-only; /dev/shm (64 MiB, 1777) and
  /dev/mqueue; /tmp, the granted binds (`--ro-bind`: read-only all the way down), /world, the guest's runtime and
  sockets in `box_mounts`' order by depth, each tmpfs sized (`--size`) and moded (`--perms`), nosuid and nodev; a
  copy-on-write world (an overlay of its parent's layers) mounted by the caller in a mount namespace of the box's
  own and bound at /world (`BwrapBox.overlay`, overlay.py), as the host mounts and binds it for a root-made runc box;
- the environment cleared and set (`--clearenv`, `--setenv`), the working directory, the hostname, `--new-session`
  (unless on a terminal: the box's own pty, whose master is quinebox's), `--die-with-parent`, and the box's
  command as its PID 1 (`--as-pid-1`), as on runc, where the lifeline is PID 1: init.py, or the native init
  (policy.init_command) where the guest runtime has one and the box needs nothing of init.py's but its command.

What the caller holds, given back in `BwrapBox` rather than dropped: the memory/pids/cpu limits (`resources`,
placed in the box's own cgroup before bwrap runs), the rlimits and OOM score (set on bwrap, which its box inherits),
and who runs bwrap (`host_ids`, never host root: bwrap maps the box's user onto the host ids that run it).

Differences that take nothing from the box's isolation, said here once:

- no /sys and no /sys/fs/cgroup: bwrap 0.8 cannot mount a sysfs; binding the host's would show the host's network
  devices and firmware, so the box has none (narrower than runc's read-only sysfs);
- the device cgroup: bwrap's /dev holds only the nodes above, and a user namespace refuses mknod of any device, as
  backends/oci/policy.py says of a rootless box;
- tmpfs roots are the box user's (bwrap mounts them as that user), not root's; /dev/shm and /dev/mqueue are not
  noexec (a box's /tmp and /world are executable anyway; an mqueue holds no files to run); mounts are slaves of
  the host's (bwrap's propagation), not private: nothing of the box's reaches the host;
- bwrap's `--chdir` sets PWD, as a shell would.

Refused, never silently dropped (a QuineboxError of kind UNSUPPORTED; `bwrap_refusal` says the same of a spec
before anything starts): `--image host` (its hidden view needs noexec, bounded-inode tmpfs mounts bwrap 0.8 cannot
say), `rootfs:rw` and `net:bridge` (no overlay for the root and no engine network in bwrap 0.8), a tmpfs
option beyond size, mode and the box user's ownership; a mount reached through one of the image's links (root.py);
and in the seccomp profile: flags (bwrap loads the filter with none), SCMP_ACT_NOTIFY or an action, operator or
architecture libseccomp does not know. bwrap run as host root is REFUSED: its box's user would be host root.

The compile needs libseccomp's Python API (`pip install quinebox[bwrap]`: pyseccomp, its ctypes binding over the
system's libseccomp.so.2), imported only there, so nothing else pays for it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from quinebox.box.backends.bwrap.root import Look, root_argv, root_seal
from quinebox.box.backends.oci.policy import oci_seccomp
from quinebox.box.policy import (
    CPU_PERIOD,
    DEFAULT_MEM,
    DEFAULT_PIDS,
    HOSTNAME,
    MASKED_PATHS,
    OOM_SCORE_ADJ,
    READONLY_PATHS,
    RLIMITS,
    BoxMount,
    box_mounts,
    bridged,
    full_environment,
    init_command,
    nano_cpus,
    seccomp_profile,
    workdir_for,
    writes_host_paths,
)
from quinebox.box.spec import HOST_IMAGE, BoxSpec, ImageInfo
from quinebox.errors import ErrorKind, QuineboxError
from quinebox.grants import parse_size

#: The source bwrap's argv names for /world's overlay, which its caller mounts (BwrapBox.overlay) and names in its
#: place before bwrap runs (box.py); never a path quinebox gives (every source it gives is absolute).
OVERLAY_SOURCE = "overlay"
#: The fd bwrap reads the box's BPF program from unless the caller says another.
SECCOMP_FD = 3
#: /dev/shm as the engine sizes it (policy.SYSTEM_MOUNTS: 65536k).
DEV_SHM = 64 << 20
#: An empty read-only tmpfs over a masked directory of /proc: nothing in it, so its size is a page.
MASK_DIR_SIZE = 4096
#: The tmpfs options bwrap says: rw, exec, nosuid and nodev are what every `--tmpfs` of it is; size and mode it
#: takes (`--size`, `--perms`); the owner is the box's user, whose the mount is.
_TMPFS_ALWAYS = frozenset({"rw", "exec", "nosuid", "nodev"})
#: OCI seccomp's actions and operators as libseccomp names them (its Python API's constants).
_ACTIONS = {"SCMP_ACT_ALLOW": "ALLOW", "SCMP_ACT_KILL": "KILL", "SCMP_ACT_KILL_THREAD": "KILL_THREAD",
            "SCMP_ACT_KILL_PROCESS": "KILL_PROCESS", "SCMP_ACT_TRAP": "TRAP", "SCMP_ACT_LOG": "LOG"}
_OPERATORS = {"SCMP_CMP_NE": "NE", "SCMP_CMP_LT": "LT", "SCMP_CMP_LE": "LE", "SCMP_CMP_EQ": "EQ",
              "SCMP_CMP_GE": "GE", "SCMP_CMP_GT": "GT", "SCMP_CMP_MASKED_EQ": "MASKED_EQ"}
#: What OCI's seccomp schema holds that a BPF program handed to bwrap can say.
_PROFILE_KEYS = frozenset({"defaultAction", "defaultErrnoRet", "architectures", "syscalls"})
EPERM = 1
#: libseccomp's answer for a name it knows on no architecture (__NR_SCMP_ERROR).
_UNKNOWN_SYSCALL = -1


def _unsupported(what: str, fix: str = "use --backend oci", **fields: Any) -> QuineboxError:
    """A box bwrap cannot hold, in one line: what (the error's `why` field, bwrap_refusal's answer) and the fix."""
    return QuineboxError(f"refused on bwrap: {what}; {fix}", kind=ErrorKind.UNSUPPORTED, backend="bwrap", why=what, **fields)


#: Why a box's spec alone keeps it off bwrap, each (applies, why, the error's fields), in the order they are told.
_REFUSED: tuple[tuple[Any, str, Any], ...] = (
    (lambda spec: spec.image == HOST_IMAGE, "--image host (its hidden view needs noexec tmpfs mounts of bounded inodes, which bwrap 0.8 cannot make)",
     lambda spec: {"image": spec.image}),
    (lambda spec: bridged(spec.grants), "net:bridge (it needs the engine's bridge network)",
     lambda spec: {"grant": "net:bridge", "fix": "use --backend docker"}),
    (lambda spec: spec.grants.rootfs_rw, "rootfs:rw (bwrap 0.8 has no overlay to give a writable root over the image's tree)",
     lambda spec: {"grant": "rootfs:rw"}),
)


def _spec_refusal(spec: BoxSpec) -> QuineboxError | None:
    """The error bwrap_box raises for what `spec` alone says (module docstring), before anything of the host is read."""
    for applies, why, fields in _REFUSED:
        if applies(spec):
            return _unsupported(why, **fields(spec))
    for mount in box_mounts(spec, runtime=""):  # the runtime's source is no part of what is refused
        try:
            _mount(mount, spec)
        except QuineboxError as refused:
            return refused
    return None


def bwrap_refusal(spec: BoxSpec) -> str | None:
    """Why bwrap cannot hold `spec`'s whole policy, in one line (the words bwrap_box's error says after "refused on
    bwrap: "); None when it can. Pure: backends/choice.py asks it before a box is chosen."""
    refused = _spec_refusal(spec)
    return None if refused is None else refused.fields["why"]


@dataclass(frozen=True)
class BwrapBox:
    """A box as bwrap runs it: `argv` (bwrap's, the box's command after `--`), the seccomp profile to compile
    (`compile_seccomp`) and hand bwrap on `seccomp_fd`, and what the caller places before bwrap runs: `resources`
    in the box's own cgroup (memory and swap in bytes, pids, cpu quota per CPU_PERIOD), `rlimits` (name, soft, hard)
    and `oom_score_adj` on bwrap's process, which its box inherits, run as `host_ids`; `own_ids`, the box's uid and
    gid, the only ids its user namespace maps (seccomp_program narrows the chown calls to them); `overlay`: the options of
    /world's overlay (a copy-on-write world), which the caller mounts and binds where argv says OVERLAY_SOURCE
    (bwrap/overlay.py), empty when /world is no overlay; `workdir_ours`: the working directory is /world, a world made
    for the box and owned by its user (worlds/build.create), which its user enters: the start looks at its mode on the
    host rather than walk to it as the box's user (box.py's `_cannot_enter`, a thread of the box's ids, for any other)."""

    argv: list[str]
    seccomp: dict[str, Any]
    seccomp_fd: int
    resources: dict[str, Any]
    rlimits: tuple[tuple[str, int, int], ...]
    oom_score_adj: int
    host_ids: tuple[int, int]
    own_ids: tuple[int, int]
    overlay: tuple[str, ...] = ()
    workdir_ours: bool = False


def proc_kinds(paths: Iterable[str] = (*MASKED_PATHS, *READONLY_PATHS)) -> dict[str, str]:
    """Which of `paths` under /proc this host's kernel has, each "dir" or "file": a box's procfs is the same
    kernel's, and bwrap, unlike runc, fails on a mask over a path that is not there. (The one look at the host here.)"""
    return {path: "dir" if os.path.isdir(path) else "file" for path in paths if path.startswith("/proc/") and os.path.lexists(path)}


def _tmpfs(mount: BoxMount, spec: BoxSpec) -> list[str]:
    """`--size`, `--perms` and `--tmpfs` for a tmpfs of the box's; an option bwrap cannot say is refused."""
    size = mode = None
    for option in mount.options:
        name, _, value = option.partition("=")
        if option in _TMPFS_ALWAYS:
            continue
        if name == "size":
            size = parse_size(value)
        elif name == "mode":
            mode = value
        elif (name, value) not in (("uid", str(spec.uid)), ("gid", str(spec.gid))):
            raise _unsupported(f"the tmpfs at {mount.dest} asks {option}, which bwrap's tmpfs cannot say", mount=mount.dest, option=option)
    return [*(("--size", str(size)) if size else ()), *(("--perms", mode) if mode else ()), "--tmpfs", mount.dest]


def _mount(mount: BoxMount, spec: BoxSpec) -> list[str]:
    if mount.kind == "tmpfs":
        return _tmpfs(mount, spec)
    if mount.kind == "bind":
        return ["--bind" if mount.writable else "--ro-bind", mount.source, mount.dest]
    if mount.kind == "overlay" and mount.dest == "/world":  # the caller mounts it (overlay.py) and names where
        return ["--bind", OVERLAY_SOURCE, mount.dest]
    raise _unsupported(f"the {mount.kind} mount at {mount.dest} (bwrap 0.8 has no overlay mount)", mount=mount.dest)


def _proc(kinds: Mapping[str, str]) -> list[str]:
    """/proc, its masked paths covered (an empty read-only tmpfs over a directory, /dev/null over a file), and its
    read-only paths bound read-only over themselves; only those this kernel has (`proc_kinds`)."""
    argv = ["--proc", "/proc"]
    for path in MASKED_PATHS:
        if kinds.get(path) == "dir":
            argv += ["--size", str(MASK_DIR_SIZE), "--perms", "0555", "--tmpfs", path, "--remount-ro", path]
        elif kinds.get(path) == "file":
            argv += ["--ro-bind", "/dev/null", path]
    for path in READONLY_PATHS:
        if path in kinds:
            argv += ["--ro-bind", path, path]
    return argv


def bwrap_box(
    spec: BoxSpec,
    *,
    image: ImageInfo,
    runtime: str,
    seccomp: dict[str, Any],
    arch: str,
    image_root: str,
    look: Look,
    host_ids: tuple[int, int],
    proc: Mapping[str, str],
    seccomp_fd: int = SECCOMP_FD,
    native_init: bool = False,
    lasting: bool = False,
) -> BwrapBox:
    """The same box as oci_config, as bwrap's argv and what its caller places around it (module docstring).

    `image_root`: the image's unpacked tree, never written (root.py makes the box's root of it); `look`: what the
    image has at a path (root.image_look(image_root), or a test's own); `runtime`: the host directory of the guest's
    runtime; `seccomp`/`arch`: quinebox's profile and the native architecture, as oci_config takes them;
    `host_ids`: the host uid and gid bwrap runs as, onto which the box's user is mapped (the caller's own when it is
    not root; an unprivileged id of the box's own when it is); `proc`: `proc_kinds()` of this host; `native_init`:
    the guest runtime has the native init; `lasting`: the box stays up for execs beside its command (init_command)."""
    if (refused := _spec_refusal(spec)) is not None:
        raise refused
    if 0 in host_ids:
        why = "refused: bwrap run as host root (uid or gid 0) would map the box's user onto host root; run it as an unprivileged host id"
        raise QuineboxError(why, kind=ErrorKind.REFUSED, backend="bwrap", host_ids=host_ids)
    grants = spec.grants
    mem, pids = grants.mem or DEFAULT_MEM, grants.pids or DEFAULT_PIDS
    resources: dict[str, Any] = {"memory": {"limit": mem, "swap": mem}, "pids": {"limit": pids}}
    if grants.cpus is not None:
        resources["cpu"] = {"period": CPU_PERIOD, "quota": nano_cpus(grants.cpus) * CPU_PERIOD // 1_000_000_000}
    own = sorted((m for m in box_mounts(spec, runtime) if not _the_images_own(m, image_root, look)), key=lambda m: os.path.normpath(m.dest).count("/"))
    dests = ["/proc", "/dev", *(m.dest for m in own)]
    workdir = workdir_for(spec, image)
    made = _made_workdir(workdir, own, look)
    if made and not _under(workdir, dests):
        dests.append(workdir)  # a mount point of root.py's tmpfs root
    argv = [
        "bwrap", "--unshare-all", "--unshare-user", "--die-with-parent", "--as-pid-1",
        *(() if spec.tty else ("--new-session",)),
        "--cap-drop", "ALL", "--uid", str(spec.uid), "--gid", str(spec.gid), "--hostname", HOSTNAME, "--clearenv",
    ]
    environment = full_environment(spec, image)
    for name, value in environment.items():
        argv += ["--setenv", name, value]
    argv += [*root_argv(image_root, look, dests), *_proc(proc)]
    argv += ["--dev", "/dev", "--size", str(DEV_SHM), "--perms", "1777", "--tmpfs", "/dev/shm", "--mqueue", "/dev/mqueue", "--remount-ro", "/dev"]
    for mount in own:
        argv += _mount(mount, spec)
    argv += [*made, *root_seal(look, dests), "--chdir", workdir, "--seccomp", str(seccomp_fd), "--",
             *init_command(spec, image, environment, native_init=native_init, lasting=lasting)]
    profile = oci_seccomp(seccomp_profile(seccomp, grants, arch, setid=not writes_host_paths(grants, spec.world)), arch)
    overlay = next((m.options for m in own if m.kind == "overlay"), ())
    ours = spec.world is not None and spec.world.kind == "dir" and os.path.normpath(workdir) == "/world"
    return BwrapBox(argv=argv, seccomp=profile, seccomp_fd=seccomp_fd, resources=resources, rlimits=RLIMITS,
                    oom_score_adj=OOM_SCORE_ADJ, host_ids=host_ids, own_ids=(spec.uid, spec.gid), overlay=overlay, workdir_ours=ours)


#: The chown calls, each with the index of its uid argument (its gid's is the next).
_CHOWNS = {"chown": 1, "fchown": 1, "lchown": 1, "fchownat": 2}
#: uid_t's bits: a caller may pass -1 as 32 bits or as 64 (Go's uintptr(-1)); the kernel reads 32.
_ID_MASK = 0xFFFFFFFF


def chown_to_own_ids(profile: dict[str, Any], uid: int, gid: int) -> dict[str, Any]:
    """`profile` with the chown calls allowed only to the box's own ids (or -1, unchanged): the rest is the default
    action's EPERM. bwrap's user namespace maps only the box's uid and gid, so the kernel answers a chown to any
    other id EINVAL (an id it cannot map), where on runc (65536 ids mapped) an unprivileged chown of a mapped id is
    EPERM; tools that keep a file's owner tolerate EPERM alone (GNU patch gave up on a file owned by nobody: "Failed
    to set the owning group ... Invalid argument"). EPERM is what either kernel says to a box with no capability."""
    syscalls = []
    for rule in profile["syscalls"]:
        chowns = [name for name in rule["names"] if name in _CHOWNS]
        if not chowns or rule["action"] != "SCMP_ACT_ALLOW" or rule.get("args"):
            syscalls.append(rule)
            continue
        if others := [name for name in rule["names"] if name not in _CHOWNS]:
            syscalls.append({**rule, "names": others})
        for name in chowns:
            index = _CHOWNS[name]
            for user in (uid, -1):
                for group in (gid, -1):
                    syscalls.append({**rule, "names": [name], "args": [
                        {"index": index, "value": _ID_MASK, "valueTwo": user & _ID_MASK, "op": "SCMP_CMP_MASKED_EQ"},
                        {"index": index + 1, "value": _ID_MASK, "valueTwo": group & _ID_MASK, "op": "SCMP_CMP_MASKED_EQ"}]})
    return {**profile, "syscalls": syscalls}


def _the_images_own(mount: BoxMount, image_root: str, look: Look) -> bool:
    """Whether `mount` binds the image's own directory read-only at its own place (the agent image's runtime at
    /.quinebox, in a box of the agent image): the root root.py makes of the image shows it there already, read-only,
    so bwrap is not asked to bind it again (each bind is CPU of every box's start: bwrap reads its mount table again)."""
    dest = os.path.normpath(mount.dest)
    return (mount.kind == "bind" and not mount.writable and look(dest) == "dir"
            and os.path.normpath(mount.source) == os.path.join(os.path.normpath(image_root), dest.lstrip("/")))


def _made_workdir(workdir: str, own: list[BoxMount], look: Look) -> tuple[str, ...]:
    """`--dir WORKDIR` where the box would have no such directory, which runc makes: a path neither the image nor any
    mount has (made on root.py's tmpfs root, never in the image), or one below a tmpfs of the box's own (its /tmp).
    Never in /proc or /dev, and never below a bind: that would write the host's directory."""
    if _under(workdir, ("/proc", "/dev")):
        return ()
    holders = [m for m in own if _under(workdir, [m.dest])]
    if not holders:
        return () if look(workdir) is not None else ("--dir", workdir)
    holder = max(holders, key=lambda m: len(os.path.normpath(m.dest)))
    return ("--dir", workdir) if holder.kind == "tmpfs" and os.path.normpath(workdir) != os.path.normpath(holder.dest) else ()


def _under(path: str, dests: Iterable[str]) -> bool:
    """Whether `path` is one of the mount destinations `dests`, or below one (it lies on that mount, not the image)."""
    path = os.path.normpath(path)
    return any(path == os.path.normpath(d) or path.startswith(os.path.normpath(d).rstrip("/") + "/") for d in dests)


def _action(name: str, errno: int | None, seccomp: Any) -> int:
    """An OCI action (and its errno, EPERM unless said) as libseccomp's action value."""
    if name == "SCMP_ACT_ERRNO":
        return int(seccomp.ERRNO(EPERM if errno is None else errno))
    if name == "SCMP_ACT_TRACE":
        return int(seccomp.TRACE(EPERM if errno is None else errno))
    if name not in _ACTIONS:
        raise _unsupported(f"seccomp action {name}", action=name)
    return int(getattr(seccomp, _ACTIONS[name]))


def _conditions(rule: dict[str, Any], seccomp: Any) -> list[list[Any]]:
    """A rule's argument conditions as libseccomp takes them, as runc adds them: all in one rule (each must hold),
    unless one argument is named twice, when each is a rule of its own (either may hold)."""
    args = []
    for arg in rule.get("args") or ():
        if arg["op"] not in _OPERATORS:
            raise _unsupported(f"seccomp operator {arg['op']}", op=arg["op"])
        args.append(seccomp.Arg(arg["index"], getattr(seccomp, _OPERATORS[arg["op"]]), arg["value"], arg.get("valueTwo", 0)))
    indexes = [arg["index"] for arg in rule.get("args") or ()]
    return [[arg] for arg in args] if len(set(indexes)) < len(indexes) else [args]


def compile_seccomp(profile: dict[str, Any]) -> bytes:
    """An OCI seccomp profile (as oci_seccomp renders it) compiled by libseccomp to the BPF program bwrap's
    `--seccomp FD` loads (seccomp_export_bpf's output): its default action, its architectures and no other, and
    each rule's action for its names under its conditions. A name libseccomp knows on no architecture is left
    out, as runc leaves it: the default action answers it, which refuses what the rule would allow. A rule whose
    action is the default's adds nothing and is left out, as runc does."""
    import pyseccomp as seccomp  # the bwrap extra: only a bwrap box pays for it

    if unknown := set(profile) - _PROFILE_KEYS:
        raise _unsupported(f"seccomp profile keys {sorted(unknown)} (bwrap loads a filter with no flags or listener)", keys=sorted(unknown))
    default = _action(profile["defaultAction"], profile.get("defaultErrnoRet"), seccomp)
    arches = []
    for name in profile.get("architectures") or ():
        token = getattr(seccomp.Arch, name.removeprefix("SCMP_ARCH_"), None)
        if not name.startswith("SCMP_ARCH_") or token is None:
            raise _unsupported(f"seccomp architecture {name}", arch=name)
        arches.append(token)
    native = seccomp.system_arch()
    filt = seccomp.SyscallFilter(default)
    for token in arches:
        if token != native:
            filt.add_arch(token)
    if arches and native not in arches:
        filt.remove_arch(native)
    for rule in profile["syscalls"]:
        action = _action(rule["action"], rule.get("errnoRet"), seccomp)
        if action == default:
            continue
        for name in rule["names"]:
            number = seccomp.resolve_syscall(seccomp.Arch.NATIVE, name)
            if number == _UNKNOWN_SYSCALL:
                continue
            for conditions in _conditions(rule, seccomp):
                filt.add_rule(action, number, *conditions)
    with os.fdopen(os.memfd_create("quinebox-seccomp", os.MFD_CLOEXEC), "w+b") as program:
        filt.export_bpf(program)
        program.seek(0)
        return program.read()


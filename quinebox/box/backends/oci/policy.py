"""The box policy.py describes, as an OCI runtime's config.json (runc, crun, runsc): the engine's controls, said out.
The OCI backend's rendering of the policy, in its room and ranked with the rules (tests/unit/test_layout.py).

A pure function beside `policy.container_config`, rendering the same decisions
(constants, `box_mounts`, limits) in the runtime's schema. What the engine adds
to every container on its own — its system mounts, masked and read-only paths,
device cgroup, default environment — is written here explicitly, since no
engine is on the path; what needs the engine itself is `policy.oci_refusal`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from quinebox.box.policy import (
    CGROUP_PREFIX,
    CPU_PERIOD,
    DEFAULT_MEM,
    DEFAULT_PIDS,
    DEVICE_RULES,
    HOSTNAME,
    MASKED_PATHS,
    OOM_SCORE_ADJ,
    READONLY_PATHS,
    RLIMITS,
    ROOT_LAYER,
    SYSTEM_MOUNTS,
    BoxMount,
    box_mounts,
    full_environment,
    image_arch,
    init_command,
    labels_for,
    nano_cpus,
    root_layer,
    seccomp_profile,
    workdir_for,
    writes_host_paths,
)
from quinebox.box.policy_host import HOST_ROOT_LAYER
from quinebox.box.spec import HOST_IMAGE, BoxSpec, ImageInfo
from quinebox.errors import GrantError

OCI_VERSION = "1.0.2"
#: Every box's own namespaces, and a user namespace besides: a root-made box's maps a span of host ids no account
#: and no other box holds (`userns`, backends/oci/idmap.py), a rootless box's its user's own ids (`Rootless`); only
#: gVisor's, whose processes are its sandbox's and not the host's, has none.
NAMESPACES = ("pid", "network", "ipc", "uts", "mount", "cgroup")
#: What OCI's seccomp schema knows, at the top, in a rule and in an argument.
_SECCOMP_KEYS = ("defaultAction", "defaultErrnoRet", "architectures", "flags", "syscalls")
_RULE_KEYS = ("names", "action", "errnoRet", "args")
_ARG_KEYS = ("index", "value", "valueTwo", "op")
#: What the host lets gVisor's own processes number, per process the box may have, and beside them. Under the
#: ptrace platform each guest thread runs in host stub threads, one for each address space and sentry thread
#: that has run it: ~5 a process for idle ones, growing with the sentry's threads for busy ones (64 busy
#: processes: 2,800 after 8 s, 4,700 after 30 s). The box's own limit is gVisor's (RLIMIT_NPROC, below); this
#: one only keeps the sandbox from the host's pid space, and a sandbox that meets it dies, said in one line.
GVISOR_TASKS_PER_PID = 32
GVISOR_TASKS_BASE = 512
#: gVisor's syscall table (2022) names a call differently: both names go in, as runsc skips a name it lacks.
_GVISOR_ALIASES = {"pselect6": "pselect"}
ENOSYS, EPERM = 38, 1


def oci_seccomp(profile: dict[str, Any], arch: str) -> dict[str, Any]:
    """`profile` in OCI's schema, as the engine converts it for a box with no capabilities on `arch`.

    A rule the engine applies only to holders of a capability goes (a box holds none), as does one for other
    architectures; what the schema does not know (comments) is left out. A condition the engine would weigh
    that this cannot (a kernel version) is refused, never dropped: dropping a condition widens the rule.
    """
    rules = []
    for rule in profile["syscalls"]:
        includes, excludes = rule.get("includes") or {}, rule.get("excludes") or {}
        if set(includes) - {"caps", "arches"} or set(excludes) - {"caps", "arches"}:
            raise ValueError(f"seccomp rule for {rule.get('names')}: conditions {sorted({*includes, *excludes})} cannot be resolved here")
        arches = {arch, image_arch(arch)}
        if includes.get("caps") or (includes.get("arches") and not arches & set(includes["arches"])) or arches & set(excludes.get("arches") or ()):
            continue
        names = rule["names"] if "names" in rule else [rule["name"]]
        out = {key: rule[key] for key in _RULE_KEYS if key in rule} | {"names": list(names)}
        if "args" in rule:
            out["args"] = [{key: arg[key] for key in _ARG_KEYS if key in arg} for arg in rule["args"]]
        rules.append(out)
    return {key: profile[key] for key in _SECCOMP_KEYS if key in profile} | {"syscalls": rules}


def gvisor_seccomp(profile: dict[str, Any]) -> dict[str, Any]:
    """An OCI seccomp profile (as `oci_seccomp` renders it) as runsc's `--oci-seccomp` applies it in the sandbox.

    runsc answers every SCMP_ACT_ERRNO with EPERM, whatever errnoRet says: a rule meant to say ENOSYS (clone3,
    which glibc then retries as clone) becomes SCMP_ACT_TRACE, which says ENOSYS where no tracer asked to see
    it — and none can, while ptrace is refused (with `syscall:ptrace` granted, a tracer could let clone3 by).
    runsc looks names up in gVisor's own table and skips what it lacks, so a call it names otherwise is given
    under both names; a skipped name is refused by the default action, never allowed. Any other errno cannot be
    said on gVisor: refused, not widened.
    """
    if profile.get("defaultErrnoRet", EPERM) != EPERM:
        raise ValueError(f"seccomp default errno {profile['defaultErrnoRet']}: gVisor's runsc answers only EPERM")
    rules = []
    for rule in profile["syscalls"]:
        out = {**rule, "names": [*rule["names"], *(_GVISOR_ALIASES[n] for n in rule["names"] if n in _GVISOR_ALIASES)]}
        errno = out.pop("errnoRet", EPERM)
        if rule["action"] == "SCMP_ACT_ERRNO" and errno == ENOSYS:
            out["action"] = "SCMP_ACT_TRACE"
        elif rule["action"] == "SCMP_ACT_ERRNO" and errno != EPERM:
            raise ValueError(f"seccomp rule for {rule['names']}: errno {errno} cannot be said on gVisor, whose runsc answers EPERM or ENOSYS")
        rules.append(out)
    return {key: value for key, value in profile.items() if key != "defaultErrnoRet"} | {"syscalls": rules}


@dataclass(frozen=True)
class Rootless:
    """A box made by a user who is not root: who they are, the ids the system gives them, their cgroup.

    The box's user is the caller, seen in the box as uid 0 and holding no capability there (none in any set,
    NoNewPrivs, our seccomp): runc makes a rootless box only with its uid 0 mapped, to the caller, since it
    hands its start FIFO to that uid. A subordinate range (/etc/subuid, through newuidmap) maps the box's uids
    1… onto it, so the image's other owners are themselves in the box; without one the box has one uid and
    gid, and every other owner shows as the overflow id. `cgroup`: the cgroup delegated to the caller, each
    box's a child of it (rootless.py finds it, `quinebox setup-user` makes one).
    """

    uid: int
    gid: int
    cgroup: str
    subuid: tuple[int, int] | None = None  # (first host id, count)
    subgid: tuple[int, int] | None = None

    def mappings(self, own: int, sub: tuple[int, int] | None) -> list[dict[str, int]]:
        return [{"containerID": 0, "hostID": own, "size": 1}, *([{"containerID": 1, "hostID": sub[0], "size": sub[1]}] if sub else [])]

    def mapped_gid(self, gid: int) -> bool:
        return gid == 0 or (self.subgid is not None and 1 <= gid <= self.subgid[1])


def _rootless_mount(mount: dict[str, Any], who: Rootless) -> dict[str, Any]:
    """A system mount as a user namespace allows: an owner the box's namespace does not map is left out (devpts'
    gid=5, without a subordinate range), as `runc spec --rootless` leaves it, rather than the box refused."""
    options = [o for o in mount.get("options", ()) if not (o.startswith("gid=") and not who.mapped_gid(int(o[4:])))]
    return {**mount, "options": options} if "options" in mount else mount


def _mount(mount: BoxMount, recursive_ro: bool) -> dict[str, Any]:
    """A box mount in the runtime's form; read-only binds are read-only all the way down: rro (runc ≥ 1.1), or
    without it (gVisor, whose own file system makes the whole of a read-only mount read-only) plain ro."""
    if mount.kind in ("tmpfs", "overlay"):
        return {"destination": mount.dest, "type": mount.kind, "source": mount.source or mount.kind, "options": list(mount.options)}
    mode = ["rw"] if mount.writable else ["ro", "rro"] if recursive_ro else ["ro"]
    return {"destination": mount.dest, "type": "bind", "source": mount.source, "options": ["rbind", "rprivate", *mode]}


def _depth(mount: BoxMount) -> int:
    """How deep a destination lies: as the engine does, shallower mounts go first so deeper ones land on them."""
    return os.path.normpath(mount.dest).count("/")


def _device(allow: bool, kind: str, major: int | None, minor: int | None, access: str) -> dict[str, Any]:
    rule: dict[str, Any] = {"allow": allow, "type": kind, "access": access}
    rule.update({name: number for name, number in (("major", major), ("minor", minor)) if number is not None})
    return rule


def oci_config(
    spec: BoxSpec,
    *,
    image: ImageInfo,
    runtime: str,
    seccomp: dict[str, Any],
    arch: str,
    rootfs: str,
    gvisor: bool = False,
    hidden: Sequence[BoxMount] = (),
    rootless: Rootless | None = None,
    userns: tuple[int, int] | None = None,
    native_init: bool = False,
    lasting: bool = False,
) -> dict[str, Any]:
    """The same box as container_config, as an OCI runtime config (config.json) for runc/crun/runsc.

    `runtime` is the host directory of the guest's runtime (at /.quinebox, read-only) and `rootfs` the host
    path of the image's unpacked root, mounted read-only. `gvisor`: for runsc, whose kernel holds the box's
    process limit (the host's pids cgroup counts gVisor's own helpers, GVISOR_TASKS_*), whose seccomp is
    `gvisor_seccomp`, and whose read-only mounts are read-only all the way down without rro. `hidden`: what of
    the root the box is not shown (policy_host.host_view, for the host's own root), mounted before the box's own
    mounts of the same depth, so a grant inside a hidden directory lands on it. `rootless`: made by a user who is
    not root (`Rootless`): the same box in a user namespace of its own, its user the caller's uid 0 there, its
    cgroup a child of the caller's; the devices cgroup, which only the host's root may write, is left out, as a
    user namespace already refuses a box every device node but those it is shown (mknod is refused in it).
    `userns`: for a box root makes, (first, count): the host ids its user namespace maps its ids 0… onto, the
    box's user (`spec.uid`) among them, none of them an account's (backends/oci/idmap.py). A box granted `rootfs:rw`
    has its root writable, the bytes of its own layer in the ROOT_LAYER annotation (backends/oci/boxroot.py); never
    over the host's own root (HOST_ROOT_LAYER). `native_init`: the guest runtime has the native init, which a
    one-shot box runs as its PID 1 where it needs nothing of init.py's (policy.init_command; never under gVisor,
    whose kernel it was not made for); `lasting`: the box stays up for execs beside its command.
    """
    if spec.grants.rootfs_rw and spec.image == HOST_IMAGE:
        raise GrantError(HOST_ROOT_LAYER)
    if rootless is not None:  # the box's user is its namespace's uid 0: its world, /world's owner, are that uid's
        spec = replace(spec, uid=0, gid=0)
    grants = spec.grants
    mem = grants.mem or DEFAULT_MEM
    pids = grants.pids or DEFAULT_PIDS
    resources: dict[str, Any] = {
        "devices": [_device(*rule) for rule in DEVICE_RULES],
        "memory": {"limit": mem, "swap": mem},  # swap is memory + swap: equal means none
        "pids": {"limit": GVISOR_TASKS_BASE + GVISOR_TASKS_PER_PID * pids if gvisor else pids},
    }
    # gVisor counts every task of a uid, threads included, as a pids cgroup does: the box's processes are one uid's.
    rlimits = [*RLIMITS, *((("nproc", pids, pids),) if gvisor else ())]
    profile = oci_seccomp(seccomp_profile(seccomp, grants, arch, setid=not writes_host_paths(grants, spec.world)), arch)
    if grants.cpus is not None:
        resources["cpu"] = {"period": CPU_PERIOD, "quota": nano_cpus(grants.cpus) * CPU_PERIOD // 1_000_000_000}
    system = [{"destination": dest, "type": kind, "source": source, "options": list(options)} for dest, kind, source, options in SYSTEM_MOUNTS]
    own = sorted([*hidden, *box_mounts(spec, runtime)], key=_depth)
    recursive_ro = not gvisor
    layer = root_layer(grants)
    annotations = labels_for(spec) | ({} if layer is None else {ROOT_LAYER: str(layer)})
    environment = full_environment(spec, image)
    config: dict[str, Any] = {
        "ociVersion": OCI_VERSION,
        "root": {"path": rootfs, "readonly": layer is None},
        "hostname": HOSTNAME,
        "process": {
            "terminal": spec.tty,
            "user": {"uid": spec.uid, "gid": spec.gid, "umask": 0o022},
            "args": init_command(spec, image, environment, native_init=native_init and not gvisor, lasting=lasting),
            "env": [f"{name}={value}" for name, value in environment.items()],
            "cwd": workdir_for(spec, image),
            "capabilities": {name: [] for name in ("bounding", "effective", "inheritable", "permitted", "ambient")},
            "noNewPrivileges": True,
            "rlimits": [{"type": f"RLIMIT_{name.upper()}", "soft": soft, "hard": hard} for name, soft, hard in rlimits],
            "oomScoreAdj": OOM_SCORE_ADJ,
        },
        "mounts": system + [_mount(m, recursive_ro) for m in own],
        "annotations": annotations,
        "linux": {
            "namespaces": [{"type": name} for name in NAMESPACES],
            "maskedPaths": list(MASKED_PATHS),
            "readonlyPaths": list(READONLY_PATHS),
            "resources": resources,
            "seccomp": gvisor_seccomp(profile) if gvisor else profile,
            "cgroupsPath": f"/{CGROUP_PREFIX}{spec.session}",
        },
    }
    if userns is not None:
        config["linux"] = own_userns(config["linux"], userns)
    if rootless is None:
        return config
    config["linux"] = rootless_linux(config["linux"], rootless, f"{CGROUP_PREFIX}{spec.session}")
    config["mounts"] = [_rootless_mount(m, rootless) for m in config["mounts"]]
    return config


def own_userns(linux: dict[str, Any], userns: tuple[int, int]) -> dict[str, Any]:
    """A config's `linux` with a user namespace of the box's own (a root-made box's), its ids 0… mapped onto the
    host ids `userns` (first, count) names, uids and gids alike; one there already is replaced (a warm box's)."""
    first, count = userns
    mapping = [{"containerID": 0, "hostID": first, "size": count}]
    namespaces = [ns for ns in linux["namespaces"] if ns.get("type") != "user"]
    return {**linux, "namespaces": [{"type": "user"}, *namespaces], "uidMappings": mapping, "gidMappings": mapping}


def rootless_linux(linux: dict[str, Any], who: Rootless, cgroup: str) -> dict[str, Any]:
    """A config's `linux` as `who`, who is not root, makes the box: in a user namespace of its own, its cgroup
    (named `cgroup`) a child of theirs, and no devices cgroup, which only the host's root may write."""
    resources = {key: value for key, value in linux.get("resources", {}).items() if key != "devices"}
    return {
        **linux,
        "namespaces": [{"type": "user"}, *linux["namespaces"]],
        "uidMappings": who.mappings(who.uid, who.subuid),
        "gidMappings": who.mappings(who.gid, who.subgid),
        "resources": resources,
        "cgroupsPath": f"{who.cgroup.rstrip('/')}/{cgroup}",
    }

"""The one place that says what a box may do: spec + grants → container configuration.

A pure function, in the spirit of nsjail's single config: no Docker, no
filesystem, so every control can be checked by a table test. The safe defaults
live here and nowhere else; grants only ever widen them by name. Each backend
renders the same decisions: the engine's HostConfig here (`container_config`),
an OCI runtime's config.json in backends/oci/policy.py, both from the constants and the
neutral mount list (`box_mounts`) below.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from quinebox.box.net.secrets import BUNDLE_VARIABLES, TLS_DIR, placeholder
from quinebox.box.spec import BoxSpec, ImageInfo
from quinebox.errors import GrantError
from quinebox.grants import Grants, format_size
from quinebox.worlds.spec import WorldSpec

DEFAULT_MEM = 1 << 30
DEFAULT_PIDS = 256
DEFAULT_TMP = 256 << 20
DEFAULT_WORLD = 1 << 30

#: Where the box's end of its host socket appears.
HOST_SOCKET = "/run/quinebox/host.sock"
#: Where the guest's runtime (box/images/guest_runtime.py) appears, read-only, in every box.
RUNTIME = "/.quinebox"
#: How every guest program starts: the runtime's own loader runs the runtime's Python, isolated from the image.
GUEST_PYTHON = (f"{RUNTIME}/lib/ld.so", "--library-path", f"{RUNTIME}/lib", f"{RUNTIME}/lib/python3", "-I", "-S")
#: The guest's init runs first and execs nothing itself: it ties the box to the host and runs argv.
GUEST_PREFIX = (*GUEST_PYTHON, f"{RUNTIME}/guest/lifeline.py", "--")
#: The native init of a one-shot box (images/init.c): in the guest runtime where its image's build could compile it.
NATIVE_INIT = f"{RUNTIME}/bin/init"
#: What runs a mission: the guest's agent loop, with the mission as its last argument.
AGENT_COMMAND = (*GUEST_PYTHON, f"{RUNTIME}/guest/agent.py", "--")
#: PATH and LANG for an image that sets none.
#: Where the guest's egress forwarder listens in a box that reaches the network through the host's proxy,
#: and the socket it hands each connection to the host over.
EGRESS_LISTEN = "127.0.0.1:3128"
EGRESS_SOCKET = "/run/quinebox/egress.sock"
BOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BOX_LANG = "C.UTF-8"

HOSTNAME = "box"
#: The kernel's OOM killer takes a box's processes before the host's.
OOM_SCORE_ADJ = 500
#: Every box process's limits (name, soft, hard): no core dumps; a bounded fd table (this machine's hard
#: nofile is 20000: a runtime config asking for more fails).
RLIMITS = (("core", 0, 0), ("nofile", 1024, 8192))
#: The CFS period a `cpus:` grant's quota is a share of (the engine's nano_cpus, as a runtime says it).
CPU_PERIOD = 100_000
#: What the engine mounts in every container before the box's own (moby oci/defaults.go; /dev/shm at the
#: engine's default 64 MiB), as (destination, type, source, options). /sys and its cgroups are read-only.
SYSTEM_MOUNTS = (
    ("/proc", "proc", "proc", ("nosuid", "noexec", "nodev")),
    ("/dev", "tmpfs", "tmpfs", ("nosuid", "strictatime", "mode=755", "size=65536k")),
    ("/dev/pts", "devpts", "devpts", ("nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5")),
    ("/dev/shm", "tmpfs", "shm", ("nosuid", "noexec", "nodev", "mode=1777", "size=65536k")),
    ("/dev/mqueue", "mqueue", "mqueue", ("nosuid", "noexec", "nodev")),
    ("/sys", "sysfs", "sysfs", ("nosuid", "noexec", "nodev", "ro")),
    ("/sys/fs/cgroup", "cgroup", "cgroup", ("nosuid", "noexec", "nodev", "relatime", "ro")),
)
#: What the engine hides (masks) and makes read-only under /proc and /sys (Docker 20.10's oci/defaults.go).
MASKED_PATHS = (
    "/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
    "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware",
)
READONLY_PATHS = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")
#: The device cgroup as the engine leaves it on runc, in order, as (allow, type, major, minor, access), None any:
#: Docker's list (moby oci/defaults.go: all denied, then null zero urandom random tty console, fuse denied), then
#: the list runc appends to every container (libcontainer/specconv AllowedDevices: mknod of any node, null random
#: full tty zero urandom, pts ptmx, tun). Opening a node needs its rule; making one needs CAP_MKNOD, which no box has.
DEVICE_RULES = (
    (False, "a", None, None, "rwm"),
    *((True, "c", major, minor, "rwm") for major, minor in ((1, 5), (1, 3), (1, 9), (1, 8), (5, 0), (5, 1))),
    (False, "c", 10, 229, "rwm"),
    (True, "c", None, None, "m"),
    (True, "b", None, None, "m"),
    *((True, "c", major, minor, "rwm") for major, minor in ((1, 3), (1, 8), (1, 7), (5, 0), (1, 5), (1, 9), (136, None), (5, 2), (10, 200))),
)
#: Grants the OCI runtime cannot give as the engine does, and why such a box runs on the engine.
_ENGINE_ONLY = (
    (lambda spec: bridged(spec.grants), "net:bridge needs the engine's bridge network"),
)

LABEL_PREFIX = "io.quinebox."
LABEL_SESSION = LABEL_PREFIX + "session"
#: A box's cgroup on an OCI runtime, at the top of each hierarchy: this and its session. No parent of ours is
#: shared, so the runtime's delete of the last box leaves nothing of quinebox's in the cgroup tree.
CGROUP_PREFIX = "quinebox-"
LABEL_OWNER = LABEL_PREFIX + "owner"
LABEL_PARENT = LABEL_PREFIX + "parent"
LABEL_CREATED = LABEL_PREFIX + "created"
#: The uid of the user who started the box: only they may `enter` it.
LABEL_USER = LABEL_PREFIX + "user"
#: On an OCI runtime, the bytes a box's writable root layer may hold (`root_layer`; backends/oci/boxroot.py sizes it).
ROOT_LAYER = LABEL_PREFIX + "root-layer"

#: The machine types Python reports, as Docker's images name them and as seccomp does.
_ARCHITECTURES = {
    "x86_64": ("amd64", "SCMP_ARCH_X86_64"),
    "amd64": ("amd64", "SCMP_ARCH_X86_64"),
    "aarch64": ("arm64", "SCMP_ARCH_AARCH64"),
    "arm64": ("arm64", "SCMP_ARCH_AARCH64"),
    "riscv64": ("riscv64", "SCMP_ARCH_RISCV64"),
    "s390x": ("s390x", "SCMP_ARCH_S390X"),
    "ppc64le": ("ppc64le", "SCMP_ARCH_PPC64LE"),
}


@dataclass(frozen=True)
class ContainerConfig:
    """Arguments for the engine: `create` for the container, `host` for its host config."""

    create: dict[str, Any]
    host: dict[str, Any]


@dataclass(frozen=True)
class BoxMount:
    """One of a box's own mounts, before a backend renders it.

    kind "bind": the host path `source` at `dest`, read-only unless `writable`; `socket` for a single socket file
    (no propagation of its own). "tmpfs": a fresh tmpfs with `options`. "overlay": a copy-on-write world, `options`
    its lowerdir, upperdir, workdir and userxattr.
    """

    kind: str
    dest: str
    source: str = ""
    writable: bool = False
    options: tuple[str, ...] = ()
    socket: bool = False


def native_arch() -> str:
    """This machine's architecture as seccomp names it."""
    return _ARCHITECTURES[os.uname().machine.lower()][1]


def native_machine() -> str:
    """This machine's architecture as an image's config names it."""
    machine = os.uname().machine.lower()
    return _ARCHITECTURES[machine][0] if machine in _ARCHITECTURES else machine


def image_arch(arch: str) -> str:
    """A seccomp architecture as an image's config (and the engine's profile conditions) name it."""
    return next((machine for machine, scmp in _ARCHITECTURES.values() if scmp == arch), arch)


def writes_host_paths(grants: Grants, world: WorldSpec | None = None) -> bool:
    """Whether what the box writes can land where the host's users run it: a `rw:` grant, or a world that is the
    caller's own directory (`--world DIR`). Its own layers, tmpfs and world under the state dir are no one else's."""
    return any(mount.writable for mount in grants.mounts) or (world is not None and world.kind == "bind")


def seccomp_profile(base: dict[str, Any], grants: Grants, arch: str, *, setid: bool = False) -> dict[str, Any]:
    """The base profile for the native architecture only, relaxed by `syscall:` grants. A new profile and new rules;
    what a rule holds (its names, its arguments) is shared with `base`, which neither side changes.

    The base's `setid` rules allow a mode only without set-uid and set-gid bits (systemd's RestrictSUIDSGID): a file
    a box gives them on a host path would let a host user who runs it become the box's user. A box that writes no
    host path (`setid`: see writes_host_paths) may set them, as a package manager installing sudo or ssh-keysign
    into a writable root does: those rules allow the call whatever its mode."""
    profile = {key: value for key, value in base.items() if key != "comment"}
    profile["architectures"] = [arch]
    rules = [
        {key: value for key, value in rule.items() if key not in ("comment", "setid") and not (setid and rule.get("setid") and key == "args")}
        for rule in base["syscalls"]
    ]
    if grants.syscalls:
        rules = [{**rule, "names": names} for rule in rules if (names := [n for n in rule["names"] if n not in grants.syscalls])]
        rules.append({"names": sorted(grants.syscalls), "action": "SCMP_ACT_ALLOW"})
    profile["syscalls"] = rules
    return profile


def workdir_for(spec: BoxSpec, image: ImageInfo | None = None) -> str:
    """The caller's cwd when a grant covers it (so relative paths mean the same), else the image's, else /world."""
    if spec.workdir:
        return spec.workdir
    for mount in spec.grants.mounts:
        rel = os.path.relpath(spec.cwd, mount.source)
        if rel == "." or not rel.startswith(".."):
            return os.path.normpath(os.path.join(mount.dest, rel))
    return (image.workdir if image else "") or "/world"


def command_for(spec: BoxSpec, image: ImageInfo) -> list[str]:
    """What the box runs: the agent loop; or argv (the image's entrypoint and command when none was given) under the lifeline."""
    if spec.agent:
        return list(spec.argv)
    return [*GUEST_PREFIX, *boxed_argv(spec, image)]


def boxed_argv(spec: BoxSpec, image: ImageInfo) -> tuple[str, ...]:
    """The box's command: its argv, or the image's entrypoint and command when none was given."""
    return spec.argv or (*image.entrypoint, *image.cmd)


def bridged(grants: Grants) -> bool:
    return any(rule.kind == "bridge" for rule in grants.net)


def proxied(spec: BoxSpec) -> bool:
    """Whether the box reaches the network only through the host's egress proxy: any net grant but net:bridge,
    or net rules a person may be asked about."""
    return bool(spec.grants.net or spec.asks.ask.net) and not bridged(spec.grants)


def environment_for(spec: BoxSpec, image: ImageInfo) -> dict[str, str | None]:
    """The image's environment stands (the engine applies it); ours goes on top: a writable HOME, the session,
    the egress forwarder for every kind of client, the grants."""
    environment: dict[str, str | None] = {"HOME": "/tmp", "TMPDIR": "/tmp", "QUINEBOX_SESSION": spec.session}
    if not image.sets("PATH"):
        environment["PATH"] = BOX_PATH
    if not image.sets("LANG"):
        environment["LANG"] = BOX_LANG
    if spec.grants.net:
        environment["QUINEBOX_NET"] = " ".join(rule.format() for rule in sorted(spec.grants.net))
    if spec.asks.ask != Grants():
        environment["QUINEBOX_ASK"] = " ".join(spec.asks.ask.format())
    if proxied(spec):
        environment["QUINEBOX_EGRESS"] = EGRESS_LISTEN
        for name in ("HTTP_PROXY", "HTTPS_PROXY"):
            environment[name] = environment[name.lower()] = f"http://{EGRESS_LISTEN}"
        environment["ALL_PROXY"] = environment["all_proxy"] = f"socks5h://{EGRESS_LISTEN}"
        environment["NO_PROXY"] = environment["no_proxy"] = "localhost,127.0.0.1,::1"
    for name, _ in spec.grants.secrets:
        environment[name] = placeholder(spec.session, name)
    if spec.tls_dir:
        environment.update({variable: f"{TLS_DIR}/bundle.pem" for variable in BUNDLE_VARIABLES}, NODE_EXTRA_CA_CERTS=f"{TLS_DIR}/ca.pem")
    environment.update(dict(spec.grants.env))  # a grant without a value (None) unsets the name
    return environment


def tmpfs_options(size: int, *extra: str) -> tuple[str, ...]:
    """A box's tmpfs: writable, executable, no set-uid files or devices, `size` bytes at most."""
    return ("rw", "exec", "nosuid", "nodev", f"size={format_size(size)}", *extra)


def world_mount(spec: BoxSpec) -> BoxMount:
    """/world: a bind mount of the world's directory; an overlay over its parent's, mounted by the engine or
    runtime (not quinebox) in the box's own mount namespace, `userxattr` keeping overlay's own markers readable
    by the world's owner; or with no world, a scratch tmpfs that keeps nothing."""
    world = spec.world
    if world is None:
        return BoxMount("tmpfs", "/world", options=tmpfs_options(spec.grants.tmp or DEFAULT_TMP, "mode=0755", f"uid={spec.uid}", f"gid={spec.gid}"))
    if world.kind in ("dir", "bind"):
        return BoxMount("bind", "/world", world.layer, writable=True)
    overlay = (f"lowerdir={':'.join(world.lowers)}", f"upperdir={world.layer}", f"workdir={world.work}", "userxattr")
    return BoxMount("overlay", "/world", "overlay", writable=True, options=overlay)


#: Why the engine gives no box `rootfs:rw`: its container layer is the host's disk with no bound (overlay2 takes a
#: size only over xfs mounted with pquota, which `docker info` does not say), and a backend is never silently weaker.
ENGINE_ROOT_LAYER = "refused rootfs:rw on the Docker engine: it cannot bound a writable root (its layer would fill the host's disk); use --backend oci"


def root_layer(grants: Grants) -> int | None:
    """The bytes a box's root may take of writes, in a layer of its own over the image's tree that goes with the box
    (`rootfs:rw`): as many as its /tmp may hold (`tmp:`), in a tmpfs (an OCI runtime's boxes; the engine refuses the
    grant: ENGINE_ROOT_LAYER). None: the root is read-only, the default."""
    return (grants.tmp or DEFAULT_TMP) if grants.rootfs_rw else None


def box_mounts(spec: BoxSpec, runtime: str) -> list[BoxMount]:
    """The box's own mounts, in order: /tmp, the granted host paths, /world, the guest's runtime, then its sockets
    and trust. Read-only unless granted rw (a world is always writable)."""
    mounts = [BoxMount("tmpfs", "/tmp", options=tmpfs_options(spec.grants.tmp or DEFAULT_TMP, "mode=1777"))]
    mounts += [BoxMount("bind", m.dest, m.source, writable=m.writable) for m in spec.grants.mounts]
    mounts.append(world_mount(spec))
    mounts.append(BoxMount("bind", RUNTIME, runtime))
    if spec.lifeline:
        mounts.append(BoxMount("bind", HOST_SOCKET, spec.lifeline, socket=True))
    if spec.tls_dir:
        mounts.append(BoxMount("bind", TLS_DIR, spec.tls_dir))
    if spec.egress_socket and proxied(spec):
        mounts.append(BoxMount("bind", EGRESS_SOCKET, spec.egress_socket, socket=True))
    return mounts


def nano_cpus(cpus: float) -> int:
    """A `cpus:` grant in billionths of a CPU (the engine's unit; a runtime's quota is this share of CPU_PERIOD)."""
    return int(cpus * 1e9)


def labels_for(spec: BoxSpec) -> dict[str, str]:
    """Whose box this is (the engine's labels, a runtime's annotations): `ps`, `kill`, `enter` and `gc` read them."""
    return {
        LABEL_SESSION: spec.session,
        LABEL_OWNER: spec.owner,
        LABEL_PARENT: spec.parent or "",
        LABEL_CREATED: spec.created,
        LABEL_USER: str(spec.caller),
        **{LABEL_PREFIX + name: value for name, value in spec.tags},
    }


def full_environment(spec: BoxSpec, image: ImageInfo) -> dict[str, str]:
    """Everything the box's first process starts with, as the engine builds it: its own PATH, HOSTNAME and (on a
    terminal) TERM, then the image's, then ours (`environment_for`); a grant without a value unsets the name."""
    environment: dict[str, str | None] = {"PATH": BOX_PATH, "HOSTNAME": HOSTNAME, **({"TERM": "xterm"} if spec.tty else {})}
    environment.update(dict(image.env))
    environment.update(environment_for(spec, image))
    return {name: value for name, value in environment.items() if value is not None}


def init_command(spec: BoxSpec, image: ImageInfo, environment: Mapping[str, str | None], *, native_init: bool, lasting: bool) -> list[str]:
    """What a runtime's or bwrap's box runs as its PID 1: the native init (images/init.c) where the guest runtime
    has one and the box needs nothing of init.py's but its command: no agent (init.py runs its loop), no terminal
    (init.py waits for its size), no egress (init.py's forwarder), not lasting (init.py starts the execs beside its
    command). Anything else runs init.py (oci_command). Both say hello on the lifeline; the native one serves no
    execs. `environment`: the box's (full_environment), which says whether it has egress."""
    if not native_init or lasting or spec.agent or spec.tty or "QUINEBOX_EGRESS" in environment:
        return oci_command(spec, image)
    return [NATIVE_INIT, "--", *boxed_argv(spec, image)]


def oci_command(spec: BoxSpec, image: ImageInfo) -> list[str]:
    """What an OCI runtime's box runs: as on the engine, but with no engine init the lifeline is PID 1 of every
    box, an agent's included."""
    return [*GUEST_PREFIX, *spec.argv] if spec.agent else command_for(spec, image)


def oci_refusal(spec: BoxSpec) -> str | None:
    """Why `spec` must run on the engine, in one line; None when an OCI runtime gives it everything."""
    return next((why for applies, why in _ENGINE_ONLY if applies(spec)), None)


def _engine_mount(mount: BoxMount, session: str) -> dict[str, Any]:
    """A mount as the engine takes it; an overlay is an anonymous volume of the local driver, removed with the box."""
    if mount.kind == "overlay":
        driver = {"Name": "local", "Options": {"type": "overlay", "device": "overlay", "o": ",".join(mount.options)}}
        return {"Type": "volume", "Target": mount.dest, "VolumeOptions": {"DriverConfig": driver, "Labels": {LABEL_SESSION: session}}}
    rendered = {"Type": "bind", "Source": mount.source, "Target": mount.dest, "ReadOnly": not mount.writable}
    if not mount.socket:
        rendered["BindOptions"] = {"Propagation": "rprivate"}
    return rendered


def container_config(spec: BoxSpec, *, image: ImageInfo, runtime: str, seccomp: dict[str, Any], arch: str) -> ContainerConfig:
    """The container for `spec` in `image`, with the guest's runtime (the host directory `runtime`) at /.quinebox.

    The hardening below is the same for every image: nothing here reads the image but its
    environment, working directory and default command, which only say what to run.
    """
    grants = spec.grants
    if grants.rootfs_rw:
        raise GrantError(ENGINE_ROOT_LAYER)
    mem = grants.mem or DEFAULT_MEM
    own = box_mounts(spec, runtime)
    host: dict[str, Any] = {
        "auto_remove": True,
        "network_mode": "bridge" if bridged(grants) else "none",
        "read_only": True,
        "cap_drop": ["ALL"],
        "security_opt": [
            "no-new-privileges:true",
            "seccomp=" + json.dumps(seccomp_profile(seccomp, grants, arch, setid=not writes_host_paths(grants, spec.world)), separators=(",", ":")),
        ],
        "init": True,
        "ipc_mode": "private",
        "pids_limit": grants.pids or DEFAULT_PIDS,
        "mem_limit": mem,
        "memswap_limit": mem,
        "oom_score_adj": OOM_SCORE_ADJ,
        "tmpfs": {m.dest: ",".join(m.options) for m in own if m.kind == "tmpfs"},
        "mounts": [_engine_mount(m, spec.session) for m in own if m.kind != "tmpfs"],
        "ulimits": [{"name": name, "soft": soft, "hard": hard} for name, soft, hard in RLIMITS],
        "log_config": {"type": "none"},
    }
    if grants.cpus is not None:
        host["nano_cpus"] = nano_cpus(grants.cpus)
    create: dict[str, Any] = {
        "image": image.id or spec.image,
        "command": command_for(spec, image),
        "name": f"quinebox-{spec.session}",
        "hostname": HOSTNAME,
        "user": f"{spec.uid}:{spec.gid}",
        "working_dir": workdir_for(spec, image),
        "environment": environment_for(spec, image),
        "labels": labels_for(spec),
        "stdin_open": True,
        "tty": spec.tty,
        "detach": False,
    }
    return ContainerConfig(create=create, host=host)

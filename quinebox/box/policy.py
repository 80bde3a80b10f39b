"""The one place that says what a box may do: spec + grants → container configuration.

A pure function, in the spirit of nsjail's single config: no Docker, no
filesystem, so every control can be checked by a table test. The safe defaults
live here and nowhere else; grants only ever widen them by name.
"""

from __future__ import annotations

import copy
import json
import os
import platform
from dataclasses import dataclass
from typing import Any

from quinebox.box.secrets import BUNDLE_VARIABLES, TLS_DIR, placeholder
from quinebox.box.spec import BoxSpec, ImageInfo, WorldSpec
from quinebox.grants import Grants, format_size

DEFAULT_MEM = 1 << 30
DEFAULT_PIDS = 256
DEFAULT_TMP = 256 << 20
DEFAULT_WORLD = 1 << 30

#: Where the box's end of its host socket appears.
HOST_SOCKET = "/run/quinebox/host.sock"
#: Where the guest's runtime (box/runtime.py) appears, read-only, in every box.
RUNTIME = "/.quinebox"
#: How every guest program starts: the runtime's own loader runs the runtime's Python, isolated from the image.
GUEST_PYTHON = (f"{RUNTIME}/lib/ld.so", "--library-path", f"{RUNTIME}/lib", f"{RUNTIME}/lib/python3", "-I", "-S")
#: The guest's init runs first and execs nothing itself: it ties the box to the host and runs argv.
GUEST_PREFIX = (*GUEST_PYTHON, f"{RUNTIME}/guest/lifeline.py", "--")
#: What runs a mission: the guest's agent loop, with the mission as its last argument.
AGENT_COMMAND = (*GUEST_PYTHON, f"{RUNTIME}/guest/agent.py", "--")
#: PATH and LANG for an image that sets none.
#: Where the guest's egress forwarder listens in a box that reaches the network through the host's proxy,
#: and the socket it hands each connection to the host over.
EGRESS_LISTEN = "127.0.0.1:3128"
EGRESS_SOCKET = "/run/quinebox/egress.sock"
BOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BOX_LANG = "C.UTF-8"

LABEL_PREFIX = "io.quinebox."
LABEL_SESSION = LABEL_PREFIX + "session"
LABEL_OWNER = LABEL_PREFIX + "owner"
LABEL_PARENT = LABEL_PREFIX + "parent"
LABEL_CREATED = LABEL_PREFIX + "created"
#: The uid of the user who started the box: only they may `enter` it.
LABEL_USER = LABEL_PREFIX + "user"

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


def native_arch() -> str:
    """This machine's architecture as seccomp names it."""
    return _ARCHITECTURES[platform.machine().lower()][1]


def native_machine() -> str:
    """This machine's architecture as an image's config names it."""
    machine = platform.machine().lower()
    return _ARCHITECTURES[machine][0] if machine in _ARCHITECTURES else machine


def seccomp_profile(base: dict[str, Any], grants: Grants, arch: str) -> dict[str, Any]:
    """The base profile for the native architecture only, relaxed by `syscall:` grants."""
    profile = copy.deepcopy(base)
    profile.pop("comment", None)
    profile["architectures"] = [arch]
    if grants.syscalls:
        rules = []
        for rule in profile["syscalls"]:
            names = [n for n in rule["names"] if n not in grants.syscalls]
            if names:
                rules.append({**rule, "names": names})
        rules.append({"names": sorted(grants.syscalls), "action": "SCMP_ACT_ALLOW"})
        profile["syscalls"] = rules
    for rule in profile["syscalls"]:
        rule.pop("comment", None)
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
    return [*GUEST_PREFIX, *(spec.argv or (*image.entrypoint, *image.cmd))]


def bridged(grants: Grants) -> bool:
    return any(rule.kind == "bridge" for rule in grants.net)


def proxied(spec: BoxSpec) -> bool:
    """Whether the box reaches the network only through the host's egress proxy: any net grant but net:bridge,
    or net rules a person may be asked about."""
    return bool(spec.grants.net or spec.asks.ask.net) and not bridged(spec.grants)


def environment_for(spec: BoxSpec, image: ImageInfo) -> dict[str, str]:
    """The image's environment stands (the engine applies it); ours goes on top: a writable HOME, the session,
    the egress forwarder for every kind of client, the grants."""
    environment = {"HOME": "/tmp", "TMPDIR": "/tmp", "QUINEBOX_SESSION": spec.session}
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
    environment.update(dict(spec.grants.env))
    return environment


def world_mount(world: WorldSpec, session: str) -> dict[str, Any]:
    """/world: a bind mount of the world's directory, or an overlay the engine mounts over its parent's.

    The overlay is an anonymous volume of the local driver, so the engine (not
    quinebox) needs the privilege to mount it and removes it with the box.
    `userxattr` keeps overlay's own markers readable by the world's owner.
    """
    if world.kind in ("dir", "bind"):
        return {"Type": "bind", "Source": world.layer, "Target": "/world", "ReadOnly": False, "BindOptions": {"Propagation": "rprivate"}}
    options = f"lowerdir={':'.join(world.lowers)},upperdir={world.layer},workdir={world.work},userxattr"
    return {
        "Type": "volume",
        "Target": "/world",
        "VolumeOptions": {
            "DriverConfig": {"Name": "local", "Options": {"type": "overlay", "device": "overlay", "o": options}},
            "Labels": {LABEL_SESSION: session},
        },
    }


def container_config(spec: BoxSpec, *, image: ImageInfo, runtime: str, seccomp: dict[str, Any], arch: str) -> ContainerConfig:
    """The container for `spec` in `image`, with the guest's runtime (the host directory `runtime`) at /.quinebox.

    The hardening below is the same for every image: nothing here reads the image but its
    environment, working directory and default command, which only say what to run.
    """
    grants = spec.grants
    mem = grants.mem or DEFAULT_MEM
    tmp = grants.tmp or DEFAULT_TMP
    mounts = [
        {
            "Type": "bind",
            "Source": m.source,
            "Target": m.dest,
            "ReadOnly": not m.writable,
            "BindOptions": {"Propagation": "rprivate"},
        }
        for m in grants.mounts
    ]
    if spec.world is not None:
        mounts.append(world_mount(spec.world, spec.session))
    mounts.append({"Type": "bind", "Source": runtime, "Target": RUNTIME, "ReadOnly": True, "BindOptions": {"Propagation": "rprivate"}})
    if spec.lifeline:
        mounts.append({"Type": "bind", "Source": spec.lifeline, "Target": HOST_SOCKET, "ReadOnly": True})
    if spec.tls_dir:
        mounts.append({"Type": "bind", "Source": spec.tls_dir, "Target": TLS_DIR, "ReadOnly": True, "BindOptions": {"Propagation": "rprivate"}})
    if spec.egress_socket and proxied(spec):
        mounts.append({"Type": "bind", "Source": spec.egress_socket, "Target": EGRESS_SOCKET, "ReadOnly": True})
    labels = {
        LABEL_SESSION: spec.session,
        LABEL_OWNER: spec.owner,
        LABEL_PARENT: spec.parent or "",
        LABEL_CREATED: spec.created,
        LABEL_USER: str(spec.caller),
        **{LABEL_PREFIX + name: value for name, value in spec.tags},
    }
    host: dict[str, Any] = {
        "auto_remove": True,
        "network_mode": "bridge" if bridged(grants) else "none",
        "read_only": True,
        "cap_drop": ["ALL"],
        "security_opt": [
            "no-new-privileges:true",
            "seccomp=" + json.dumps(seccomp_profile(seccomp, grants, arch), separators=(",", ":")),
        ],
        "init": True,
        "ipc_mode": "private",
        "pids_limit": grants.pids or DEFAULT_PIDS,
        "mem_limit": mem,
        "memswap_limit": mem,
        "oom_score_adj": 500,
        "tmpfs": {"/tmp": f"rw,exec,nosuid,nodev,size={format_size(tmp)},mode=1777"},
        "mounts": mounts,
        "ulimits": [{"name": "core", "soft": 0, "hard": 0}],
        "log_config": {"type": "none"},
    }
    if spec.world is None:  # a scratch world that keeps nothing
        host["tmpfs"]["/world"] = f"rw,exec,nosuid,nodev,size={format_size(tmp)},mode=0755,uid={spec.uid},gid={spec.gid}"
    if grants.cpus is not None:
        host["nano_cpus"] = int(grants.cpus * 1e9)
    create: dict[str, Any] = {
        "image": image.id or spec.image,
        "command": command_for(spec, image),
        "name": f"quinebox-{spec.session}",
        "hostname": "box",
        "user": f"{spec.uid}:{spec.gid}",
        "working_dir": workdir_for(spec, image),
        "environment": environment_for(spec, image),
        "labels": labels,
        "stdin_open": True,
        "tty": spec.tty,
        "detach": False,
    }
    return ContainerConfig(create=create, host=host)

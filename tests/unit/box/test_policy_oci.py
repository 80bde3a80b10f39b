"""policy_oci.oci_config as a table: the safe defaults in the runtime's terms, the same box as container_config, and
control by control the same box as bubblewrap's command line (bwrap.policy.bwrap_box)."""

import json
import operator
from dataclasses import replace

import pytest
from bwrap_argv import bwrap, env, flags, mounts, options, own
from test_policy import AGENT_IMAGE, ARCH, RUNTIME_DIR, USER_IMAGE, spec  # the same images, runtime and specs as the engine's table

from quinebox.audit.asks import Asks
from quinebox.box.backends.bwrap.policy import OVERLAY_SOURCE, BwrapBox, bwrap_refusal
from quinebox.box.backends.oci.policy import GVISOR_TASKS_BASE, GVISOR_TASKS_PER_PID, Rootless, gvisor_seccomp, oci_config, oci_seccomp
from quinebox.box.net.secrets import TLS_DIR
from quinebox.box.policy import (
    AGENT_COMMAND,
    DEFAULT_MEM,
    DEFAULT_PIDS,
    DEFAULT_TMP,
    EGRESS_SOCKET,
    GUEST_PREFIX,
    NATIVE_INIT,
    HOST_SOCKET,
    LABEL_SESSION,
    ROOT_LAYER,
    RUNTIME,
    container_config,
    oci_command,
    oci_refusal,
)
from quinebox.box.policy_host import HOST_ROOT_LAYER
from quinebox.box.spec import HOST_IMAGE, BoxSpec, ImageInfo, seccomp_base
from quinebox.errors import GrantError
from quinebox.grants import Grants
from quinebox.worlds.spec import WorldSpec

ROOTFS = "/state/images/sha256-agent/rootfs"
DIR_WORLD = WorldSpec(kind="dir", layer="/state/sessions/s1/world/tree")
OVERLAY_WORLD = WorldSpec(kind="overlay", layer="/s/c/upper", work="/s/c/work", lowers=("/s/p/upper", "/s/g/tree"), base=("p", 3))
#: The engine's system mounts, as the runtime must be told them.
SYSTEM = [
    {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
    {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
    {"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
    {"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
    {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]},
    {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
    {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup", "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]},
]


def oci(box: BoxSpec, image: ImageInfo = AGENT_IMAGE) -> dict:
    return oci_config(box, image=image, runtime=RUNTIME_DIR, seccomp=seccomp_base(), arch=ARCH, rootfs=ROOTFS)


def docker(box: BoxSpec, image: ImageInfo = AGENT_IMAGE):
    return container_config(box, image=image, runtime=RUNTIME_DIR, seccomp=seccomp_base(), arch=ARCH)


def own_mounts(cfg: dict) -> list[dict]:
    assert cfg["mounts"][: len(SYSTEM)] == SYSTEM
    return cfg["mounts"][len(SYSTEM):]


def env_of(cfg: dict) -> dict[str, str]:
    names = [item.split("=", 1)[0] for item in cfg["process"]["env"]]
    assert len(names) == len(set(names)), f"a name twice in {names}"
    return dict(item.split("=", 1) for item in cfg["process"]["env"])


# -- the safe defaults, with no grant ---------------------------------------------------------------------------

def devices(cfg: dict) -> list[dict]:
    return cfg["linux"]["resources"]["devices"]


ALLOWED_RWM = {("c", 1, 3), ("c", 1, 5), ("c", 1, 7), ("c", 1, 8), ("c", 1, 9), ("c", 5, 0), ("c", 5, 1), ("c", 5, 2), ("c", 136, None), ("c", 10, 200)}


@pytest.mark.parametrize(
    "what, value, expected",
    [
        ("oci version", lambda c: c["ociVersion"], "1.0.2"),
        ("read-only root", lambda c: c["root"], {"path": ROOTFS, "readonly": True}),
        ("no capability in any set", lambda c: c["process"]["capabilities"], dict.fromkeys(("bounding", "effective", "inheritable", "permitted", "ambient"), [])),
        ("no new privileges", lambda c: c["process"]["noNewPrivileges"], True),
        ("never uid 0", lambda c: c["process"]["user"], {"uid": 1000, "gid": 1000, "umask": 0o022}),
        ("no terminal", lambda c: c["process"]["terminal"], False),
        ("six namespaces of its own", lambda c: c["linux"]["namespaces"], [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount", "cgroup")]),
        ("masked paths", lambda c: c["linux"]["maskedPaths"], [
            "/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
            "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware"]),
        ("read-only paths", lambda c: c["linux"]["readonlyPaths"], ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]),
        ("memory, no swap", lambda c: c["linux"]["resources"]["memory"], {"limit": DEFAULT_MEM, "swap": DEFAULT_MEM}),
        ("pids", lambda c: c["linux"]["resources"]["pids"], {"limit": DEFAULT_PIDS}),
        ("no cpu quota", lambda c: "cpu" in c["linux"]["resources"], False),
        ("oom score", lambda c: c["process"]["oomScoreAdj"], 500),
        ("no core dumps, a bounded fd table", lambda c: c["process"]["rlimits"], [
            {"type": "RLIMIT_CORE", "soft": 0, "hard": 0}, {"type": "RLIMIT_NOFILE", "soft": 1024, "hard": 8192}]),
        ("devices: all denied first", lambda c: devices(c)[0], {"allow": False, "type": "a", "access": "rwm"}),
        ("devices: exactly the defaults opened", lambda c: {(d["type"], d["major"], d.get("minor")) for d in devices(c) if d["allow"] and d["access"] == "rwm"}, ALLOWED_RWM),
        ("devices: wildcards only make nodes", lambda c: {(d["type"], d["access"]) for d in devices(c) if d["allow"] and "major" not in d}, {("c", "m"), ("b", "m")}),
        ("devices: fuse denied", lambda c: {"allow": False, "type": "c", "major": 10, "minor": 229, "access": "rwm"} in devices(c), True),
        ("seccomp: native arch only", lambda c: c["linux"]["seccomp"]["architectures"], [ARCH]),
        ("seccomp: default EPERM", lambda c: (c["linux"]["seccomp"]["defaultAction"], c["linux"]["seccomp"]["defaultErrnoRet"]), ("SCMP_ACT_ERRNO", 1)),
        ("hostname", lambda c: c["hostname"], "box"),
        ("cgroup", lambda c: c["linux"]["cgroupsPath"], "/quinebox-s1"),
        ("no sysctl, hooks or devices to create", lambda c: {"sysctl", "devices"} & set(c["linux"]) | {"hooks"} & set(c), set()),
        ("the engine's system mounts first", lambda c: c["mounts"][: len(SYSTEM)], SYSTEM),
        ("then /tmp, the scratch world, the runtime, the lifeline", lambda c: own_mounts(c), [
            {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["rw", "exec", "nosuid", "nodev", "size=256m", "mode=1777"]},
            {"destination": "/world", "type": "tmpfs", "source": "tmpfs", "options": ["rw", "exec", "nosuid", "nodev", "size=256m", "mode=0755", "uid=1000", "gid=1000"]},
            {"destination": RUNTIME, "type": "bind", "source": RUNTIME_DIR, "options": ["rbind", "rprivate", "ro", "rro"]},
            {"destination": HOST_SOCKET, "type": "bind", "source": "/state/run/s1.sock", "options": ["rbind", "rprivate", "ro", "rro"]},
        ]),
        ("the image's workdir", lambda c: c["process"]["cwd"], "/world"),
        ("the lifeline is pid 1", lambda c: c["process"]["args"], [*GUEST_PREFIX, "echo", "hi"]),
    ],
)
def test_safe_defaults_without_any_grant(what, value, expected):
    assert value(oci(spec())) == expected


def test_nothing_in_the_environment_but_the_engines_and_ours():
    assert env_of(oci(spec())) == {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOSTNAME": "box", "HOME": "/tmp", "TMPDIR": "/tmp",
        "QUINEBOX_SESSION": "s1", "LANG": "C.UTF-8",
    }


def test_the_fd_limit_fits_this_machines_hard_limit():
    [nofile] = [r for r in oci(spec())["process"]["rlimits"] if r["type"] == "RLIMIT_NOFILE"]
    assert nofile["soft"] <= nofile["hard"] <= 20000


# -- what grants change -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "grant, key, expected",
    [
        ("mem:128m", "memory", {"limit": 128 << 20, "swap": 128 << 20}),
        ("pids:32", "pids", {"limit": 32}),
        ("cpus:1.5", "cpu", {"period": 100000, "quota": 150000}),
        ("cpus:0.25", "cpu", {"period": 100000, "quota": 25000}),
        ("cpus:0.1", "cpu", {"period": 100000, "quota": 10000}),
        ("cpus:2", "cpu", {"period": 100000, "quota": 200000}),
    ],
)
def test_resource_grants_map_to_the_cgroup(grant, key, expected):
    assert oci(spec(grant))["linux"]["resources"][key] == expected


def test_tmp_grant_sizes_both_tmpfs():
    sizes = {m["destination"]: [o for o in m["options"] if o.startswith("size=")] for m in own_mounts(oci(spec("tmp:64m"))) if m["type"] == "tmpfs"}
    assert sizes == {"/tmp": ["size=64m"], "/world": ["size=64m"]}


@pytest.mark.parametrize(
    "grants, layer",
    [
        ((), None),
        (("rootfs:rw",), DEFAULT_TMP),
        (("rootfs:rw", "tmp:64m"), 64 << 20),
        (("tmp:64m",), None),
    ],
)
def test_rootfs_rw_makes_the_root_writable_its_layer_as_large_as_tmp_and_nothing_else_differs(grants, layer):
    """The one difference: root.readonly, and the layer's bytes for the runtime (boxroot sizes its tmpfs by them)."""
    cfg, plain = oci(spec(*grants)), oci(spec(*(g for g in grants if g != "rootfs:rw")))
    assert cfg["root"] == {"path": ROOTFS, "readonly": layer is None}
    assert cfg["annotations"].get(ROOT_LAYER) == (None if layer is None else str(layer))
    strip = lambda c: {**c, "root": None, "annotations": {k: v for k, v in c["annotations"].items() if k != ROOT_LAYER}}  # noqa: E731
    assert strip(cfg) == strip(plain)
    if layer is None:
        assert docker(spec(*grants)).host["read_only"] is True
    else:  # the engine's layer is its disk's, unbounded: refused (test_policy.py)
        with pytest.raises(GrantError, match="^refused rootfs:rw on the Docker engine"):
            docker(spec(*grants))


@pytest.mark.parametrize(
    "how",
    [
        {},  # runc made by root: the host's files would be the box root's (an idmapped view of `/`)
        {"gvisor": True},
        {"rootless": Rootless(1002, 1002, "/sys/fs/cgroup/user")},  # the root a directory on the state dir's disk
        {"userns": (1 << 30, 65536)},
    ],
)
def test_rootfs_rw_over_the_hosts_own_root_is_refused_by_rule(how):
    box = replace(spec("rootfs:rw", "tmp:8m"), image=HOST_IMAGE)
    with pytest.raises(GrantError) as refused:
        oci_config(box, image=ImageInfo(name=HOST_IMAGE, id=HOST_IMAGE), runtime=RUNTIME_DIR, seccomp=seccomp_base(), arch=ARCH, rootfs="/", **how)
    assert str(refused.value) == HOST_ROOT_LAYER and "\n" not in HOST_ROOT_LAYER and refused.value.exit_code == 125
    assert oci_config(replace(box, grants=Grants.parse(["tmp:8m"], cwd="/")), image=ImageInfo(name=HOST_IMAGE, id=HOST_IMAGE), runtime=RUNTIME_DIR,
                      seccomp=seccomp_base(), arch=ARCH, rootfs="/", **how)["root"]["readonly"] is True


def test_granted_paths_are_recursive_binds_read_only_all_the_way_down_unless_rw():
    mounts = own_mounts(oci(spec("ro:/data", "rw:/src=/work", lifeline=None)))
    assert [m for m in mounts if m["type"] == "bind"] == [
        {"destination": "/data", "type": "bind", "source": "/data", "options": ["rbind", "rprivate", "ro", "rro"]},
        {"destination": "/work", "type": "bind", "source": "/src", "options": ["rbind", "rprivate", "rw"]},
        {"destination": RUNTIME, "type": "bind", "source": RUNTIME_DIR, "options": ["rbind", "rprivate", "ro", "rro"]},
    ]


def test_a_mount_inside_the_world_lands_on_it_not_under_it():
    destinations = [m["destination"] for m in own_mounts(oci(spec("rw:/src=/world/src", "ro:/a/b/c", world=DIR_WORLD)))]
    assert destinations.index("/world") < destinations.index("/world/src")
    assert destinations == ["/tmp", "/world", RUNTIME, "/world/src", "/a/b/c", HOST_SOCKET]


@pytest.mark.parametrize("kind", ["dir", "bind"])
def test_a_dir_or_bind_world_is_a_read_write_bind(kind):
    [world] = [m for m in own_mounts(oci(spec(world=WorldSpec(kind=kind, layer="/w/tree")))) if m["destination"] == "/world"]
    assert world == {"destination": "/world", "type": "bind", "source": "/w/tree", "options": ["rbind", "rprivate", "rw"]}


def test_an_inherited_world_is_an_overlay_the_runtime_mounts_in_the_box():
    [world] = [m for m in own_mounts(oci(spec(world=OVERLAY_WORLD))) if m["destination"] == "/world"]
    assert world == {
        "destination": "/world", "type": "overlay", "source": "overlay",
        "options": ["lowerdir=/s/p/upper:/s/g/tree", "upperdir=/s/c/upper", "workdir=/s/c/work", "userxattr"],
    }


def test_trust_and_the_egress_socket_are_mounted_read_only_only_for_a_proxied_box():
    proxied = own_mounts(oci(spec("net:api.example.com", "secret:TOKEN@api.example.com", tls_dir="/run/s1.tls", egress_socket="/run/s1.egress")))
    by_dest = {m["destination"]: (m["source"], m["options"]) for m in proxied}
    assert by_dest[TLS_DIR] == ("/run/s1.tls", ["rbind", "rprivate", "ro", "rro"])
    assert by_dest[EGRESS_SOCKET] == ("/run/s1.egress", ["rbind", "rprivate", "ro", "rro"])
    bridged = own_mounts(oci(spec("net:bridge", egress_socket="/run/s1.egress")))
    assert EGRESS_SOCKET not in {m["destination"] for m in bridged}


def test_the_images_environment_in_order_with_ours_on_top():
    assert oci(spec(), USER_IMAGE)["process"]["env"] == [
        "PATH=/usr/local/bin:/usr/bin:/bin", "HOSTNAME=box", "LANG=C.UTF-8", "HOME=/tmp", "PYTHONPATH=/app",
        "TMPDIR=/tmp", "QUINEBOX_SESSION=s1",
    ]


def test_a_terminal_gets_term_as_the_engine_gives_it():
    cfg = oci(spec(tty=True))
    assert cfg["process"]["terminal"] is True and env_of(cfg)["TERM"] == "xterm"


def test_an_env_grant_without_a_value_unsets_the_name_as_on_the_engine():
    env = env_of(oci(spec("env:A=1", "env:B=", "env:HOME"), USER_IMAGE))
    assert env["A"] == "1" and env["B"] == "" and "HOME" not in env


@pytest.mark.parametrize(
    "box, image, expected",
    [
        (spec(), AGENT_IMAGE, [*GUEST_PREFIX, "echo", "hi"]),
        (spec(argv=()), USER_IMAGE, [*GUEST_PREFIX, "docker-entrypoint.sh", "python3"]),
        (spec(argv=(*AGENT_COMMAND, "the mission"), agent=True), AGENT_IMAGE, [*GUEST_PREFIX, *AGENT_COMMAND, "the mission"]),
    ],
)
def test_the_lifeline_is_pid_1_of_every_box_an_agents_included(box, image, expected):
    assert oci_command(box, image) == expected
    assert oci(box, image)["process"]["args"] == expected


def test_syscall_grants_relax_the_profile_as_on_the_engine():
    profile = oci(spec("syscall:clone3", "syscall:ptrace"))["linux"]["seccomp"]
    assert {"names": ["clone3", "ptrace"], "action": "SCMP_ACT_ALLOW"} in profile["syscalls"]
    assert not [r for r in profile["syscalls"] if "clone3" in r["names"] and r["action"] != "SCMP_ACT_ALLOW"]


def test_tags_become_annotations_beside_quineboxs_own():
    annotations = oci(spec(tags=(("run", "ab12"),)))["annotations"]
    assert annotations["io.quinebox.run"] == "ab12" and annotations[LABEL_SESSION] == "s1"


# -- both renderings agree ---------------------------------------------------------------------------------------

BOXES = {
    "no grant": (spec(), AGENT_IMAGE),
    "a user's image": (spec(), USER_IMAGE),
    "its default command": (spec(argv=()), USER_IMAGE),
    "limits": (spec("mem:128m", "pids:32", "cpus:1.5", "tmp:64m"), AGENT_IMAGE),
    "a quarter cpu": (spec("cpus:0.25"), AGENT_IMAGE),
    "ro and rw paths": (spec("ro:/data", "rw:/src=/work", "ro:/home/u/proj"), USER_IMAGE),
    "a path inside the world": (spec("rw:/src=/world/src", world=DIR_WORLD), AGENT_IMAGE),
    "a dir world": (spec(world=DIR_WORLD), AGENT_IMAGE),
    "a bind world": (spec(world=WorldSpec(kind="bind", layer="/home/u/proj")), AGENT_IMAGE),
    "an overlay world": (spec(world=OVERLAY_WORLD), AGENT_IMAGE),
    "no world, no lifeline": (spec(lifeline=None), AGENT_IMAGE),
    "a terminal": (spec(tty=True, caller=4242), USER_IMAGE),
    "an agent": (spec(argv=(*AGENT_COMMAND, "the mission"), agent=True), AGENT_IMAGE),
    "secrets": (spec("net:api.example.com", "secret:TOKEN@api.example.com", tls_dir="/run/s1.tls", egress_socket="/run/s1.egress"), AGENT_IMAGE),
    "net": (spec("net", egress_socket="/run/s1.egress"), USER_IMAGE),
    "net rules to ask about": (spec(asks=Asks.parse(["net:*.example.com"], ["net:10.0.0.0/8"], cwd="/"), egress_socket="/run/s1.egress"), AGENT_IMAGE),
    "env grants": (spec("env:A=1", "env:B=", "env:LANG=de_DE.UTF-8"), USER_IMAGE),
    "syscall grants": (spec("syscall:clone3", "syscall:ptrace"), AGENT_IMAGE),
    "tags and a parent": (spec(tags=(("run", "r1"), ("attempt", "2")), parent="p0"), AGENT_IMAGE),
}


def docker_mounts(cfg) -> dict[str, tuple]:
    """Every mount of the engine's config by destination: (kind, source, read-only, options)."""
    out = {dest: ("tmpfs", "tmpfs", False, opts) for dest, opts in cfg.host["tmpfs"].items()}
    for m in cfg.host["mounts"]:
        if m["Type"] == "volume":
            o = m["VolumeOptions"]["DriverConfig"]["Options"]
            out[m["Target"]] = (o["type"], o["device"], False, o["o"])
        else:
            out[m["Target"]] = ("bind", m["Source"], m["ReadOnly"], "")
    return out


def oci_mounts(cfg: dict) -> dict[str, tuple]:
    out = {}
    for m in own_mounts(cfg):
        if m["type"] == "bind":
            readonly = "ro" in m["options"]
            assert ("rro" in m["options"]) == readonly and ("rw" in m["options"]) != readonly
            assert m["options"][:2] == ["rbind", "rprivate"]
            out[m["destination"]] = ("bind", m["source"], readonly, "")
        else:
            out[m["destination"]] = (m["type"], m["source"], False, ",".join(m["options"]))
    assert len(out) == len(own_mounts(cfg)), "a destination twice"
    return out


def engine_seccomp(cfg) -> dict:
    [opt] = [o for o in cfg.host["security_opt"] if o.startswith("seccomp=")]
    return json.loads(opt[len("seccomp="):])


AGREEMENT = {
    "user": lambda d, o, box: d.create["user"] == f"{o['process']['user']['uid']}:{o['process']['user']['gid']}",
    "workdir": lambda d, o, box: d.create["working_dir"] == o["process"]["cwd"],
    "terminal": lambda d, o, box: d.create["tty"] is o["process"]["terminal"],
    "memory": lambda d, o, box: (d.host["mem_limit"], d.host["memswap_limit"]) == (o["linux"]["resources"]["memory"]["limit"], o["linux"]["resources"]["memory"]["swap"]),
    "pids": lambda d, o, box: d.host["pids_limit"] == o["linux"]["resources"]["pids"]["limit"],
    "cpu": lambda d, o, box: (
        d.host["nano_cpus"] == o["linux"]["resources"]["cpu"]["quota"] * 10**9 // o["linux"]["resources"]["cpu"]["period"]
        if "nano_cpus" in d.host else "cpu" not in o["linux"]["resources"]
    ),
    "mounts": lambda d, o, box: docker_mounts(d) == oci_mounts(o),
    "seccomp, as the engine would convert it": lambda d, o, box: oci_seccomp(engine_seccomp(d), ARCH) == o["linux"]["seccomp"],
    "seccomp, nothing to convert": lambda d, o, box: engine_seccomp(d) == o["linux"]["seccomp"],
    "oom score": lambda d, o, box: d.host["oom_score_adj"] == o["process"]["oomScoreAdj"],
    "rlimits": lambda d, o, box: [(f"RLIMIT_{u['name'].upper()}", u["soft"], u["hard"]) for u in d.host["ulimits"]]
    == [(r["type"], r["soft"], r["hard"]) for r in o["process"]["rlimits"]],
    "hostname": lambda d, o, box: d.create["hostname"] == o["hostname"],
    "labels": lambda d, o, box: d.create["labels"] == {k: v for k, v in o["annotations"].items() if k != ROOT_LAYER},
    "argv": lambda d, o, box: o["process"]["args"] == ([*GUEST_PREFIX, *d.create["command"]] if box.agent else d.create["command"]),
    "read-only root": lambda d, o, box: d.host["read_only"] is o["root"]["readonly"] is True,
    "no new privileges": lambda d, o, box: "no-new-privileges:true" in d.host["security_opt"] and o["process"]["noNewPrivileges"] is True,
    "no capabilities": lambda d, o, box: d.host["cap_drop"] == ["ALL"] and "cap_add" not in d.host and not any(o["process"]["capabilities"].values()),
    "network none, ipc private": lambda d, o, box: (d.host["network_mode"], d.host["ipc_mode"]) == ("none", "private")
    and {"type": "network"} in o["linux"]["namespaces"] and {"type": "ipc"} in o["linux"]["namespaces"],
}


@pytest.mark.parametrize("control", sorted(AGREEMENT))
@pytest.mark.parametrize("name", sorted(BOXES))
def test_both_renderings_say_the_same(name, control):
    box, image = BOXES[name]
    assert AGREEMENT[control](docker(box, image), oci(box, image), box)


# -- the same controls on bubblewrap, beside runc ------------------------------------------------------------------

#: What a kernel of this host has under /proc of MASKED_PATHS and READONLY_PATHS: all of them, so each is rendered.
EVERY_PROC = {**dict.fromkeys(("/proc/asound", "/proc/acpi", "/proc/scsi", "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys"), "dir"),
              **dict.fromkeys(("/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug",
                               "/proc/sysrq-trigger"), "file")}
#: bwrap's --unshare-all: every namespace but the user's and cgroup's "if it can" (--unshare-user asks the user's outright).
UNSHARE_ALL = {"pid", "network", "ipc", "uts", "mount", "cgroup"}
SIZE = {"k": 10, "m": 20, "g": 30}


def runc_mount(m: dict) -> tuple:
    """A runtime mount as what the box gets: a tmpfs (bytes, mode), a bind (source, read-only)."""
    opts = {o.partition("=")[0]: o.partition("=")[2] for o in m["options"]}
    if m["type"] == "tmpfs":
        return ("tmpfs", int(opts["size"][:-1]) << SIZE[opts["size"][-1]], opts["mode"])
    if m["type"] == "overlay":
        return ("overlay", tuple(m["options"]))
    return ("bind", m["source"], "ro" in opts)


def bwrap_mount(m: tuple) -> tuple:
    return ("tmpfs", int(m[2]), m[3]) if m[0] == "--tmpfs" else ("bind", m[1], m[0] == "--ro-bind")


def runc_mounts(c: dict, *dests: str) -> dict:
    return {m["destination"]: runc_mount(m) for m in own_mounts(c) if not dests or m["destination"] in dests}


def bwrap_mounts(b: BwrapBox, *dests: str) -> dict:
    """A copy-on-write world is the overlay its caller mounts (b.overlay, bwrap/overlay.py), bound where OVERLAY_SOURCE is."""
    return {(m[1] if m[0] == "--tmpfs" else m[2]): ("overlay", b.overlay) if m[:2] == ("--bind", OVERLAY_SOURCE) else bwrap_mount(m)
            for m in own(b.argv) if not dests or (m[1] if m[0] == "--tmpfs" else m[2]) in dests}


def bwrap_namespaces(b: BwrapBox) -> set[str]:
    f = flags(b.argv)
    return (UNSHARE_ALL - ({"network"} if "--share-net" in f else set()) if "--unshare-all" in f else {"mount"}) | ({"user"} if "--unshare-user" in f else set())


def bwrap_masked(b: BwrapBox) -> list[str]:
    """/proc's paths bwrap covers: an empty read-only tmpfs over a directory, /dev/null over a file."""
    every = mounts(b.argv)
    tmpfs = [m[1] for m in every if m[0] == "--tmpfs" and m[1].startswith("/proc/") and ("--remount-ro", m[1]) in every]
    return sorted(tmpfs + [m[2] for m in every if m[:2] == ("--ro-bind", "/dev/null") and m[2].startswith("/proc/")])


#: Each control of the policy: (runc's rendering of it from config.json, bwrap's from its argv and what its caller
#: places, how the two must relate: the same, or for namespaces bwrap's are runc's and the user's). NoNewPrivs: bwrap sets it on every
#: sandbox and no option of its undoes it (the kernel's answer, NoNewPrivs 1, is test_policy_bwrap's real box's).
BWRAP_CONTROLS = {
    "namespaces: every one runc has, the user's too": (
        lambda c: {n["type"] for n in c["linux"]["namespaces"]}, bwrap_namespaces, lambda runc, ours: ours == runc | {"user"}),
    "network: only its own (lo)": (lambda c: {"type": "network"} in c["linux"]["namespaces"], lambda b: "--share-net" not in flags(b.argv), operator.eq),
    "no capability in any set": (
        lambda c: [k for k, v in c["process"]["capabilities"].items() if v], lambda b: [o for o in options(b.argv) if o[0].startswith("--cap") and o != ("--cap-drop", "ALL")]
        + ([] if ("--cap-drop", "ALL") in options(b.argv) else ["no --cap-drop ALL"]), operator.eq),
    "no new privileges": (lambda c: c["process"]["noNewPrivileges"], lambda b: not {"--cap-add", "--userns", "--userns2"} & set(b.argv), operator.eq),
    "seccomp: the same profile, loaded": (
        lambda c: c["linux"]["seccomp"], lambda b: b.seccomp if ("--seccomp", str(b.seccomp_fd)) in options(b.argv) else None, operator.eq),
    "read-only root": (
        lambda c: c["root"]["readonly"],
        lambda b: mounts(b.argv)[-1] == ("--remount-ro", "/") and mounts(b.argv)[0][:2] == ("--tmpfs", "/") and not [m for m in mounts(b.argv) if m[0] == "--bind" and m[2] == "/"],
        operator.eq),
    "/proc's masked paths": (lambda c: sorted(p for p in c["linux"]["maskedPaths"] if p.startswith("/proc/")), bwrap_masked, operator.eq),
    "/proc's read-only paths": (
        lambda c: sorted(c["linux"]["readonlyPaths"]),
        lambda b: sorted(m[2] for m in mounts(b.argv) if m[0] == "--ro-bind" and m[1] == m[2] and m[1].startswith("/proc/")), operator.eq),
    "no writable /sys (bwrap: none at all)": (
        lambda c: [m["destination"] for m in c["mounts"] if m["destination"].startswith("/sys") and "ro" not in m["options"]],
        lambda b: [m[-1] for m in mounts(b.argv) if m[-1].startswith("/sys")], operator.eq),
    "devices: no host device but the standard nodes": (
        lambda c: {(d["type"], d["major"], d.get("minor")) for d in c["linux"]["resources"]["devices"] if d["allow"] and d["access"] == "rwm"} == ALLOWED_RWM,
        lambda b: ("--dev", "/dev") in mounts(b.argv) and ("--remount-ro", "/dev") in mounts(b.argv) and "--dev-bind" not in b.argv, operator.eq),
    "/tmp": (lambda c: runc_mounts(c, "/tmp"), lambda b: bwrap_mounts(b, "/tmp"), operator.eq),
    "/world": (lambda c: runc_mounts(c, "/world"), lambda b: bwrap_mounts(b, "/world"), operator.eq),
    "every mount of the box's own, in order": (lambda c: list(runc_mounts(c).items()), lambda b: list(bwrap_mounts(b).items()), operator.eq),
    "memory, pids, cpu": (lambda c: {k: v for k, v in c["linux"]["resources"].items() if k != "devices"}, lambda b: b.resources, operator.eq),
    "rlimits": (lambda c: [(r["type"], r["soft"], r["hard"]) for r in c["process"]["rlimits"]],
                lambda b: [(f"RLIMIT_{name.upper()}", soft, hard) for name, soft, hard in b.rlimits], operator.eq),
    "oom score": (lambda c: c["process"]["oomScoreAdj"], lambda b: b.oom_score_adj, operator.eq),
    "user": (lambda c: (c["process"]["user"]["uid"], c["process"]["user"]["gid"]),
             lambda b: tuple(int(o[1]) for o in options(b.argv) if o[0] in ("--uid", "--gid")), operator.eq),
    "environment": (env_of, lambda b: env(b.argv), operator.eq),
    "working directory": (lambda c: c["process"]["cwd"], lambda b: next(o[1] for o in options(b.argv) if o[0] == "--chdir"), operator.eq),
    "hostname": (lambda c: c["hostname"], lambda b: next(o[1] for o in options(b.argv) if o[0] == "--hostname"), operator.eq),
    "a session of its own unless on a terminal": (lambda c: not c["process"]["terminal"], lambda b: "--new-session" in flags(b.argv), operator.eq),
    "the command, the lifeline its pid 1": (lambda c: c["process"]["args"], lambda b: b.argv[b.argv.index("--") + 1:] if "--as-pid-1" in flags(b.argv) else None, operator.eq),
}
BWRAP_HOLDS = sorted(BOXES)


@pytest.mark.parametrize("control", sorted(BWRAP_CONTROLS))
@pytest.mark.parametrize("name", BWRAP_HOLDS)
def test_runc_and_bwrap_render_each_control_alike(name, control):
    box, image = BOXES[name]
    runc, bwrapped, holds = BWRAP_CONTROLS[control]
    ours, theirs = runc(oci(box, image)), bwrapped(bwrap(box, image, proc=EVERY_PROC))
    assert holds(ours, theirs), (ours, theirs)


@pytest.mark.parametrize("name", sorted(BOXES))
def test_bwrap_refuses_only_what_it_cannot_hold(name):
    """Every box of the table, the overlay world too (bwrap 0.8 has no overlay mount: its caller mounts it, overlay.py)."""
    box, _ = BOXES[name]
    why = bwrap_refusal(box)
    assert (why is not None) is (name not in BWRAP_HOLDS)
    assert why is None or "\n" not in why


@pytest.mark.parametrize("name", sorted(BOXES))
def test_both_environments_agree(name):
    box, image = BOXES[name]
    engine, runtime = docker(box, image).create["environment"], env_of(oci(box, image))
    image_env = dict(image.env)
    unset = {k for k, v in engine.items() if v is None}
    assert {k: v for k, v in runtime.items() if k in engine} == {k: v for k, v in engine.items() if v is not None}
    assert {k: v for k, v in runtime.items() if k in image_env and k not in engine} == {k: v for k, v in image_env.items() if k not in engine}
    # nothing else but what the engine itself adds
    assert set(runtime) - set(engine) - set(image_env) == {"HOSTNAME"} | ({"TERM"} if box.tty else set()) - unset


@pytest.mark.parametrize("name", sorted(BOXES))
def test_every_mount_is_absolute_and_the_config_is_plain_json(name):
    box, image = BOXES[name]
    cfg = oci(box, image)
    assert all(m["destination"].startswith("/") and m["source"] for m in cfg["mounts"])
    assert all(isinstance(o, str) for m in cfg["mounts"] for o in m["options"])
    assert json.loads(json.dumps(cfg)) == cfg  # lists, not tuples; nothing json would change


# -- which boxes run only on the engine --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "grants, expected",
    [
        ((), None),
        (("net",), None),
        (("net:example.com:443",), None),
        (("ro:/data", "rw:/src=/work", "mem:1g", "cpus:1"), None),
        (("net:bridge",), "net:bridge needs the engine's bridge network"),
        (("net:bridge", "ro:/data"), "net:bridge needs the engine's bridge network"),
    ],
)
def test_oci_refusal_names_what_only_the_engine_gives(grants, expected):
    assert oci_refusal(spec(*grants)) == expected


def test_a_refusal_is_one_line():
    assert "\n" not in oci_refusal(spec("net:bridge"))


# -- seccomp in OCI's schema -------------------------------------------------------------------------------------

PROFILE = {"comment": "x", "defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 1, "architectures": [ARCH], "syscalls": []}


@pytest.mark.parametrize(
    "rule, expected",
    [
        ({"names": ["read"], "action": "SCMP_ACT_ALLOW", "comment": "c"}, [{"names": ["read"], "action": "SCMP_ACT_ALLOW"}]),
        ({"name": "read", "action": "SCMP_ACT_ALLOW"}, [{"names": ["read"], "action": "SCMP_ACT_ALLOW"}]),
        ({"names": ["mount"], "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["CAP_SYS_ADMIN"]}}, []),
        ({"names": ["x"], "action": "SCMP_ACT_ALLOW", "excludes": {"caps": ["CAP_SYS_ADMIN"]}}, [{"names": ["x"], "action": "SCMP_ACT_ALLOW"}]),
        ({"names": ["x"], "action": "SCMP_ACT_ALLOW", "includes": {"arches": ["arm64"]}}, []),
        ({"names": ["x"], "action": "SCMP_ACT_ALLOW", "includes": {"arches": ["amd64", "x32"]}}, [{"names": ["x"], "action": "SCMP_ACT_ALLOW"}]),
        ({"names": ["x"], "action": "SCMP_ACT_ALLOW", "excludes": {"arches": ["amd64"]}}, []),
        (
            {"names": ["clone"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 0, "value": 1, "op": "SCMP_CMP_MASKED_EQ", "comment": "c"}]},
            [{"names": ["clone"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 0, "value": 1, "op": "SCMP_CMP_MASKED_EQ"}]}],
        ),
        ({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38}, [{"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38}]),
    ],
)
def test_oci_seccomp_keeps_what_the_engine_would_apply_to_a_box_without_capabilities(rule, expected):
    out = oci_seccomp({**PROFILE, "syscalls": [rule]}, ARCH)
    assert out == {"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 1, "architectures": [ARCH], "syscalls": expected}


def test_oci_seccomp_refuses_a_condition_it_cannot_weigh_rather_than_widen_the_rule():
    with pytest.raises(ValueError, match="minKernel"):
        oci_seccomp({**PROFILE, "syscalls": [{"names": ["x"], "action": "SCMP_ACT_ALLOW", "includes": {"minKernel": "4.8"}}]}, ARCH)


def test_the_shipped_profile_needs_no_conversion():
    profile = oci(spec())["linux"]["seccomp"]
    assert profile == engine_seccomp(docker(spec()))
    assert len(profile["syscalls"]) == len(seccomp_base()["syscalls"])


def test_the_hardening_is_the_same_whatever_the_image():
    ours, theirs = oci(spec(), AGENT_IMAGE), oci(spec(), USER_IMAGE)
    for key in ("root", "mounts", "linux", "annotations", "hostname"):
        assert ours[key] == theirs[key]
    for key in ("user", "capabilities", "noNewPrivileges", "rlimits", "oomScoreAdj", "terminal"):
        assert ours["process"][key] == theirs["process"][key]


def test_the_engines_config_keeps_its_nofile_limit():
    assert docker(spec()).host["ulimits"] == [{"name": "core", "soft": 0, "hard": 0}, {"name": "nofile", "soft": 1024, "hard": 8192}]


def test_rendering_leaves_the_spec_and_base_profile_untouched():
    base = seccomp_base()
    before = json.dumps(base, sort_keys=True)
    box = spec("syscall:ptrace")
    oci_config(box, image=AGENT_IMAGE, runtime=RUNTIME_DIR, seccomp=base, arch=ARCH, rootfs=ROOTFS)
    assert json.dumps(base, sort_keys=True) == before
    assert replace(box) == box


#: A profile as oci_seccomp leaves it, which gvisor_seccomp is given.
RENDERED = {key: value for key, value in PROFILE.items() if key != "comment"}


def gvisor(box: BoxSpec) -> dict:
    return oci_config(box, image=AGENT_IMAGE, runtime=RUNTIME_DIR, seccomp=seccomp_base(), arch=ARCH, rootfs=ROOTFS, gvisor=True)


@pytest.mark.parametrize("grants, pids", [((), DEFAULT_PIDS), (("pids:64",), 64), (("pids:1",), 1)])
def test_on_gvisor_the_boxs_process_limit_is_gvisors_and_the_host_cgroup_sized_for_its_helpers(grants, pids):
    config = gvisor(spec(*grants))
    assert {"type": "RLIMIT_NPROC", "soft": pids, "hard": pids} in config["process"]["rlimits"]
    assert config["linux"]["resources"]["pids"] == {"limit": GVISOR_TASKS_BASE + GVISOR_TASKS_PER_PID * pids}
    assert "RLIMIT_NPROC" not in {r["type"] for r in oci(spec(*grants))["process"]["rlimits"]}  # runc: the cgroup is the box's
    assert oci(spec(*grants))["linux"]["resources"]["pids"] == {"limit": pids}


def test_on_gvisor_read_only_binds_are_plain_ro_and_the_rest_is_the_same():
    ours, runc = gvisor(spec("ro:/data")), oci(spec("ro:/data"))
    assert not any("rro" in m["options"] for m in ours["mounts"])
    assert [m["destination"] for m in ours["mounts"]] == [m["destination"] for m in runc["mounts"]]
    for key in ("user", "capabilities", "noNewPrivileges", "args", "env"):
        assert ours["process"][key] == runc["process"][key]


@pytest.mark.parametrize(
    "rule, expected",
    [
        ({"names": ["read"], "action": "SCMP_ACT_ALLOW"}, {"names": ["read"], "action": "SCMP_ACT_ALLOW"}),
        ({"names": ["select", "pselect6"], "action": "SCMP_ACT_ALLOW"}, {"names": ["select", "pselect6", "pselect"], "action": "SCMP_ACT_ALLOW"}),
        ({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38}, {"names": ["clone3"], "action": "SCMP_ACT_TRACE"}),
        ({"names": ["x"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1}, {"names": ["x"], "action": "SCMP_ACT_ERRNO"}),
        ({"names": ["x"], "action": "SCMP_ACT_ERRNO"}, {"names": ["x"], "action": "SCMP_ACT_ERRNO"}),
        (
            {"names": ["clone"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 0, "value": 2114060288, "op": "SCMP_CMP_MASKED_EQ"}]},
            {"names": ["clone"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 0, "value": 2114060288, "op": "SCMP_CMP_MASKED_EQ"}]},
        ),
    ],
)
def test_gvisor_seccomp_says_each_rule_as_runsc_applies_it(rule, expected):
    out = gvisor_seccomp({**RENDERED, "syscalls": [rule]})
    assert out == {"defaultAction": "SCMP_ACT_ERRNO", "architectures": [ARCH], "syscalls": [expected]}


@pytest.mark.parametrize(
    "profile, words",
    [
        ({**RENDERED, "defaultErrnoRet": 38}, "default errno 38"),
        ({**RENDERED, "syscalls": [{"names": ["x"], "action": "SCMP_ACT_ERRNO", "errnoRet": 13}]}, "errno 13 cannot be said on gVisor"),
    ],
)
def test_gvisor_seccomp_refuses_an_errno_runsc_cannot_say_rather_than_change_it(profile, words):
    with pytest.raises(ValueError, match=words):
        gvisor_seccomp(profile)


def test_the_shipped_profile_on_gvisor_keeps_every_refusal():
    runc, ours = oci(spec())["linux"]["seccomp"], gvisor(spec())["linux"]["seccomp"]
    assert len(ours["syscalls"]) == len(runc["syscalls"])
    allowed = {n for r in ours["syscalls"] if r["action"] == "SCMP_ACT_ALLOW" for n in r["names"]}
    assert allowed - {n for r in runc["syscalls"] if r["action"] == "SCMP_ACT_ALLOW" for n in r["names"]} == {"pselect"}
    assert not allowed & {"ptrace", "unshare", "setns", "mount", "io_uring_setup", "clone3", "bpf", "keyctl"}
    assert [r["action"] for r in ours["syscalls"] if "clone3" in r["names"]] == ["SCMP_ACT_TRACE"]


#: Which init a runtime's box runs (policy.init_command): the native one for a one-shot box where the guest runtime
#: has it, never under gVisor; init.py for a lasting box, a terminal, egress, and wherever there is none.
RUNTIME_INITS = [
    ("a one-shot box", spec(), {}, True),
    ("under gVisor", spec(), {"gvisor": True}, False),
    ("a lasting box", spec(), {"lasting": True}, False),
    ("a terminal", spec(tty=True), {}, False),
    ("egress", spec("net:example.com:443"), {}, False),
    ("no native init in the runtime", spec(), {"native_init": False}, False),
]


@pytest.mark.parametrize(("name", "box", "kw", "native"), RUNTIME_INITS, ids=[i[0] for i in RUNTIME_INITS])
def test_a_one_shot_runtime_box_runs_the_native_init(name, box, kw, native):
    config = oci_config(box, image=AGENT_IMAGE, runtime=RUNTIME_DIR, seccomp=seccomp_base(), arch=ARCH, rootfs=ROOTFS, **({"native_init": True} | kw))
    assert config["process"]["args"] == ([NATIVE_INIT, "--", "echo", "hi"] if native else [*GUEST_PREFIX, "echo", "hi"])

"""backends/bwrap/policy.py's bwrap_box as a table: the safe defaults as bwrap's options, the same box as oci_config, what is
refused, and the seccomp profile compiled by libseccomp and held by the kernel under a real bwrap."""

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import replace

import pytest
from bwrap_argv import IMAGE, IMAGE_ROOT, PROC, TMP, TreeLook, bwrap, command, env, flags, mounts, options, own, root, system
from test_policy import AGENT_IMAGE, ARCH, RUNTIME_DIR, spec
from test_policy_oci import BOXES, DIR_WORLD, OVERLAY_WORLD, env_of, oci, own_mounts

from quinebox.box.backends.bwrap.policy import OVERLAY_SOURCE, bwrap_box, bwrap_refusal, compile_seccomp, proc_kinds
from quinebox.box.backends.bwrap.root import ROOT_TMPFS, image_look
from quinebox.audit.asks import Asks
from quinebox.box.policy import GUEST_PREFIX, HOST_SOCKET, NATIVE_INIT, RUNTIME
from quinebox.box.spec import HOST_IMAGE, seccomp_base
from quinebox.errors import ErrorKind, QuineboxError
from quinebox.worlds.spec import WorldSpec

# -- the safe defaults, with no grant ---------------------------------------------------------------------------

@pytest.mark.parametrize(
    "what, value, expected",
    [
        ("every namespace, the user's asked outright", lambda a: flags(a)[:2], ["--unshare-all", "--unshare-user"]),
        ("the network too: no --share-net", lambda a: "--share-net" in a, False),
        ("dies with its parent", lambda a: "--die-with-parent" in flags(a), True),
        ("the box's command is its pid 1, as on runc", lambda a: "--as-pid-1" in flags(a), True),
        ("a session of its own (no TIOCSTI into the caller's terminal)", lambda a: "--new-session" in flags(a), True),
        ("no capability", lambda a: [o for o in options(a) if o[0] in ("--cap-drop", "--cap-add")], [("--cap-drop", "ALL")]),
        ("never uid 0", lambda a: [o for o in options(a) if o[0] in ("--uid", "--gid")], [("--uid", "1000"), ("--gid", "1000")]),
        ("hostname", lambda a: [o for o in options(a) if o[0] == "--hostname"], [("--hostname", "box")]),
        ("the environment cleared before any is set", lambda a: flags(a).index("--clearenv") < flags(a).index("--setenv"), True),
        ("the root: a tmpfs, the image's entries read-only, a directory lacking a mount point a tmpfs; read-only at the end", root, [
            ("--tmpfs", "/", str(ROOT_TMPFS), "0755"), ("--symlink", "usr/bin", "/bin"), ("--ro-bind", f"{IMAGE_ROOT}/etc", "/etc"),
            ("--ro-bind", f"{IMAGE_ROOT}/opt", "/opt"), ("--tmpfs", "/run", str(ROOT_TMPFS), "0755"), ("--ro-bind", f"{IMAGE_ROOT}/run/lock", "/run/lock"),
            ("--ro-bind", f"{IMAGE_ROOT}/usr", "/usr"), ("--ro-bind", f"{IMAGE_ROOT}/var", "/var"),
            ("--remount-ro", "/run"), ("--remount-ro", "/"),
        ]),
        ("read-only once its mounts are made", lambda a: mounts(a)[-1], ("--remount-ro", "/")),
        ("/proc, masked and read-only where this kernel has it", lambda a: system(a)[:7], [
            ("--proc", "/proc"),
            ("--tmpfs", "/proc/acpi", "4096", "0555"), ("--remount-ro", "/proc/acpi"),
            ("--ro-bind", "/dev/null", "/proc/kcore"),
            ("--ro-bind", "/dev/null", "/proc/keys"),
            ("--tmpfs", "/proc/scsi", "4096", "0555"), ("--remount-ro", "/proc/scsi"),
        ]),
        ("/proc's read-only paths", lambda a: system(a)[7:9], [
            ("--ro-bind", "/proc/sys", "/proc/sys"), ("--ro-bind", "/proc/sysrq-trigger", "/proc/sysrq-trigger")]),
        ("/dev bwrap's own, then read-only", lambda a: system(a)[9:], [
            ("--dev", "/dev"), ("--tmpfs", "/dev/shm", str(64 << 20), "1777"), ("--mqueue", "/dev/mqueue"), ("--remount-ro", "/dev")]),
        ("no /sys (bwrap cannot mount a sysfs; the host's is not shown)", lambda a: [m for m in mounts(a) if "/sys" in m[-1] and "/proc" not in m[-1]], []),
        ("then /tmp, the scratch world, the runtime, the lifeline", own, [
            ("--tmpfs", "/tmp", str(TMP), "1777"),
            ("--tmpfs", "/world", str(TMP), "0755"),
            ("--ro-bind", RUNTIME_DIR, RUNTIME),
            ("--ro-bind", "/state/run/s1.sock", HOST_SOCKET),
        ]),
        ("the image's workdir", lambda a: [o for o in options(a) if o[0] == "--chdir"], [("--chdir", "/world")]),
        ("the seccomp filter on fd 3", lambda a: [o for o in options(a) if o[0] == "--seccomp"], [("--seccomp", "3")]),
        ("the lifeline runs the command", command, [*GUEST_PREFIX, "echo", "hi"]),
    ],
)
def test_safe_defaults_without_any_grant(what, value, expected):
    assert value(bwrap(spec()).argv) == expected


def test_what_the_caller_places_around_bwrap():
    box = bwrap(spec())
    assert box.resources == {"memory": {"limit": 1 << 30, "swap": 1 << 30}, "pids": {"limit": 256}}
    assert box.rlimits == (("core", 0, 0), ("nofile", 1024, 8192))
    assert (box.oom_score_adj, box.host_ids, box.seccomp_fd) == (500, (1000, 1000), 3)


def test_masks_only_what_this_kernel_has():
    assert [m for m in mounts(bwrap(spec(), proc={}).argv) if m[-1].startswith("/proc/") or "/proc/" in m[1]] == []


# -- what grants change -----------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "grant, expected",
    [
        ("mem:128m", {"memory": {"limit": 128 << 20, "swap": 128 << 20}, "pids": {"limit": 256}}),
        ("pids:32", {"memory": {"limit": 1 << 30, "swap": 1 << 30}, "pids": {"limit": 32}}),
        ("cpus:1.5", {"memory": {"limit": 1 << 30, "swap": 1 << 30}, "pids": {"limit": 256}, "cpu": {"period": 100000, "quota": 150000}}),
        ("cpus:0.1", {"memory": {"limit": 1 << 30, "swap": 1 << 30}, "pids": {"limit": 256}, "cpu": {"period": 100000, "quota": 10000}}),
    ],
)
def test_resource_grants_are_the_callers_to_place_in_the_cgroup(grant, expected):
    assert bwrap(spec(grant)).resources == expected


def test_tmp_grant_sizes_both_tmpfs():
    tmpfs = [m for m in own(bwrap(spec("tmp:64m")).argv) if m[0] == "--tmpfs"]
    assert tmpfs == [("--tmpfs", "/tmp", str(64 << 20), "1777"), ("--tmpfs", "/world", str(64 << 20), "0755")]


def test_granted_paths_are_read_only_binds_unless_rw():
    assert [m for m in own(bwrap(spec("ro:/data", "rw:/src=/work", lifeline=None)).argv) if m[0] != "--tmpfs"] == [
        ("--ro-bind", "/data", "/data"), ("--bind", "/src", "/work"), ("--ro-bind", RUNTIME_DIR, RUNTIME)]


@pytest.mark.parametrize("kind", ["dir", "bind"])
def test_a_dir_or_bind_world_is_a_read_write_bind(kind):
    from quinebox.worlds.spec import WorldSpec

    assert ("--bind", "/w/tree", "/world") in own(bwrap(spec(world=WorldSpec(kind=kind, layer="/w/tree"))).argv)


def test_a_mount_inside_the_world_lands_on_it_not_under_it():
    dests = [m[2] if m[0] != "--tmpfs" else m[1] for m in own(bwrap(spec("rw:/src=/world/src", "ro:/a/b/c", world=DIR_WORLD)).argv)]
    assert dests == ["/tmp", "/world", RUNTIME, "/world/src", "/a/b/c", HOST_SOCKET]


@pytest.mark.parametrize(("world", "workdir", "ours"), [
    (DIR_WORLD, None, True),  # the default: /world, made for the box and its user's
    (DIR_WORLD, "/world/", True),
    (DIR_WORLD, "/world/sub", False),  # below it: what the box made there may shut its user out
    (DIR_WORLD, "/tmp", False),
    (DIR_WORLD, "/opt/a", False),  # the image's: its modes say
    (WorldSpec(kind="bind", layer="/home/me/project"), None, False),  # the host's directory (`--world DIR`): its modes say
    (OVERLAY_WORLD, None, False),  # a child's overlay of its parent's layers
])
def test_only_a_world_made_for_the_box_spares_its_start_the_walk_to_its_working_directory(world, workdir, ours):
    """box.py walks to the working directory as the box's user before the box starts (a refusal is one line, nothing
    run), but for /world when it is a world made for the box: its user owns it, and always enters it."""
    assert bwrap(spec(world=world, **({"workdir": workdir} if workdir else {}))).workdir_ours is ours


@pytest.mark.parametrize(("workdir", "made", "tmpfs"), [
    ("/opt/new/deep", ("--dir", "/opt/new/deep"), "/opt"),  # under an image directory: that directory a tmpfs, the rest made there
    ("/nowhere", ("--dir", "/nowhere"), "/"),  # at the top: made on the root's tmpfs
    ("/opt/a", None, None),  # the image has it
    ("/world/sub", None, None),  # below a bind: the host's directory, never written
    ("/tmp/x/y", ("--dir", "/tmp/x/y"), "/tmp"),  # below the box's own tmpfs: made there, its user's
    ("/tmp", None, None),  # the tmpfs itself
    ("/proc/sys", None, None),
])
def test_a_working_directory_the_image_lacks_is_made_on_a_tmpfs_as_runc_makes_it(workdir, made, tmpfs):
    argv = bwrap(spec(workdir=workdir, world=DIR_WORLD)).argv
    dirs = [o for o in options(argv) if o[0] == "--dir"]
    assert dirs == ([made] if made else [])
    assert argv[argv.index("--chdir") + 1] == workdir
    if made:  # made after every mount, before the root is sealed read-only, and never in the image
        assert options(argv).index(made) < options(argv).index(("--remount-ro", "/"))
        assert tmpfs == "/" or ("--tmpfs", tmpfs) in options(argv)


def test_the_images_own_runtime_is_shown_by_the_root_not_bound_again():
    """A box of the agent image, whose runtime is the image's own /.quinebox: the root made of the image shows it,
    read-only, so bwrap binds it no second time; a runtime from elsewhere (another image's box) is bound as ever."""
    look = TreeLook({**IMAGE, RUNTIME: 0o755, "/world": 0o755})  # every top-level point the agent image's
    agents = bwrap_box(spec(), image=AGENT_IMAGE, runtime=f"{IMAGE_ROOT}{RUNTIME}", seccomp=seccomp_base(), arch=ARCH, image_root=IMAGE_ROOT,
                       look=look, host_ids=(1000, 1000), proc=PROC)
    assert [o for o in options(agents.argv) if o[-1] == RUNTIME] == []
    assert mounts(agents.argv)[0] == ("--ro-bind", IMAGE_ROOT, "/")  # the image's tree, /.quinebox and all, read-only
    other = bwrap_box(spec(), image=AGENT_IMAGE, runtime=RUNTIME_DIR, seccomp=seccomp_base(), arch=ARCH, image_root=IMAGE_ROOT,
                      look=look, host_ids=(1000, 1000), proc=PROC)
    assert [o for o in options(other.argv) if o[-1] == RUNTIME] == [("--ro-bind", RUNTIME_DIR, RUNTIME)]


#: Which init a box's PID 1 runs (policy.init_command): the native one only where the runtime has it and the box
#: needs nothing of init.py's but its command.
INITS = [
    ("a plain one-shot box", spec(), {}, "native"),
    ("the runtime has no native init", spec(), {"native_init": False}, "init.py"),
    ("a lasting box (execs beside it)", spec(), {"lasting": True}, "init.py"),
    ("a terminal (its size awaited)", spec(tty=True), {}, "init.py"),
    ("egress (the forwarder)", spec("net:example.com:443"), {}, "init.py"),
    ("asked-about egress (the forwarder)", spec(asks=Asks.parse(["net:example.com"], cwd="/")), {}, "init.py"),
    ("an agent (init.py runs its loop, as on runc)", spec(agent=True, argv=("/agent", "--", "m")), {}, "agent"),
    ("grants that need no init's help", spec("mem:64m", "pids:10", "ro:/etc", "spawn:2", "time:5s", "env:A=b"), {}, "native"),
]


@pytest.mark.parametrize(("name", "box", "kw", "expected"), INITS, ids=[i[0] for i in INITS])
def test_a_one_shot_box_runs_the_native_init_and_any_other_init_py(name, box, kw, expected):
    argv = command(bwrap(box, **({"native_init": True} | kw)).argv)
    started = {"native": [NATIVE_INIT, "--", "echo", "hi"], "init.py": [*GUEST_PREFIX, "echo", "hi"], "agent": [*GUEST_PREFIX, "/agent", "--", "m"]}
    assert argv == started[expected]


def test_the_native_init_runs_the_images_own_command_when_none_is_given():
    image = replace(AGENT_IMAGE, entrypoint=("/entry",), cmd=("arg",))
    assert command(bwrap(spec(argv=()), image, native_init=True).argv) == [NATIVE_INIT, "--", "/entry", "arg"]


def test_a_terminal_keeps_the_session_its_pty_gives_it():
    argv = bwrap(spec(tty=True)).argv
    assert "--new-session" not in flags(argv) and env(argv)["TERM"] == "xterm"


# -- the same box as on runc --------------------------------------------------------------------------------------

SAME = {name: box for name, box in BOXES.items() if name != "an overlay world"}


@pytest.mark.parametrize("name", SAME)
def test_the_same_box_as_oci_config(name):
    """Environment, command, working directory, user, the box's own mounts (kind, source, destination, ro/rw, size,
    mode), limits and the seccomp profile are oci_config's, control by control."""
    box, image = SAME[name]
    cfg, rendered = oci(box, image), bwrap(box, image)
    argv = rendered.argv
    assert env(argv) == env_of(cfg)
    assert command(argv) == cfg["process"]["args"]
    assert [o[1] for o in options(argv) if o[0] == "--chdir"] == [cfg["process"]["cwd"]]
    assert [o[1] for o in options(argv) if o[0] in ("--uid", "--gid")] == [str(cfg["process"]["user"]["uid"]), str(cfg["process"]["user"]["gid"])]
    expected = []
    for m in own_mounts(cfg):
        opts = {o.partition("=")[0]: o.partition("=")[2] for o in m["options"]}
        if m["type"] == "tmpfs":
            assert set(opts) <= {"rw", "exec", "nosuid", "nodev", "size", "mode", "uid", "gid"}
            expected.append(("--tmpfs", m["destination"], str(int(opts["size"][:-1]) << {"k": 10, "m": 20, "g": 30}[opts["size"][-1]]), opts["mode"]))
        else:
            expected.append(("--bind" if "rw" in opts else "--ro-bind", m["source"], m["destination"]))
    assert own(argv) == expected
    assert rendered.resources == {k: v for k, v in cfg["linux"]["resources"].items() if k != "devices"}
    assert rendered.seccomp == cfg["linux"]["seccomp"]
    assert ("--new-session" in argv) is not cfg["process"]["terminal"]


def test_an_overlay_world_is_runcs_overlay_mounted_by_the_caller_and_bound_read_write():
    """A child's copy-on-write world: the same overlay as oci_config's (its layers, userxattr), which the caller mounts
    (overlay.py) and binds at /world where the argv names OVERLAY_SOURCE; every other control as oci_config's."""
    box, image = BOXES["an overlay world"]
    cfg, rendered = oci(box, image), bwrap(box, image)
    [world] = [m for m in own_mounts(cfg) if m["destination"] == "/world"]
    assert (world["type"], rendered.overlay) == ("overlay", tuple(world["options"]))
    assert [m for m in own(rendered.argv) if m[-1] == "/world"] == [("--bind", OVERLAY_SOURCE, "/world")]
    assert bwrap_refusal(box) is None and bwrap(spec()).overlay == ()
    assert rendered.seccomp == cfg["linux"]["seccomp"] and env(rendered.argv) == env_of(cfg)


def test_the_setid_rules_hold_only_where_the_box_writes_a_host_path():
    plain, writes = bwrap(spec()).seccomp, bwrap(spec("rw:/src=/work")).seccomp
    assert [r for r in plain["syscalls"] if r["names"] == ["mkdir"]] == [{"names": ["mkdir"], "action": "SCMP_ACT_ALLOW"}]
    assert [r for r in writes["syscalls"] if r["names"] == ["mkdir"]][0]["args"] == [{"index": 1, "value": 3072, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]


# -- refused, never dropped ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "box, kw, kind, field",
    [
        (replace(spec(), image=HOST_IMAGE), {}, ErrorKind.UNSUPPORTED, ("image", HOST_IMAGE)),
        (spec("net:bridge"), {}, ErrorKind.UNSUPPORTED, ("grant", "net:bridge")),
        (spec("rootfs:rw"), {}, ErrorKind.UNSUPPORTED, ("grant", "rootfs:rw")),
        (spec(), {"host_ids": (0, 0)}, ErrorKind.REFUSED, ("host_ids", (0, 0))),
        (spec(), {"host_ids": (1000, 0)}, ErrorKind.REFUSED, ("host_ids", (1000, 0))),
    ],
)
def test_what_bwrap_cannot_hold_is_refused_in_one_line(box, kw, kind, field):
    with pytest.raises(QuineboxError) as refused:
        bwrap(box, **kw)
    assert refused.value.kind == kind and refused.value.fields[field[0]] == field[1] and refused.value.fields["backend"] == "bwrap"
    assert refused.value.exit_code == 125 and "\n" not in str(refused.value)
    if kind == ErrorKind.UNSUPPORTED:  # what the spec alone says: bwrap_refusal, before anything starts, in the same words
        assert str(refused.value).startswith(f"refused on bwrap: {bwrap_refusal(box)}; use --backend ")
    else:
        assert bwrap_refusal(box) is None


@pytest.mark.parametrize("name", SAME)
def test_a_box_bwrap_holds_is_not_refused(name):
    assert bwrap_refusal(SAME[name][0]) is None


# -- the seccomp filter: libseccomp's BPF, held by the kernel -------------------------------------------------------

def profile(*grants: str) -> dict:
    return bwrap(spec(*grants)).seccomp


@pytest.mark.parametrize(
    "change, key",
    [
        ({"flags": ["SECCOMP_FILTER_FLAG_SPEC_ALLOW"]}, "keys"),
        ({"listenerPath": "/run/l.sock"}, "keys"),
        ({"architectures": ["SCMP_ARCH_VAX"]}, "arch"),
        ({"syscalls": [{"names": ["getpid"], "action": "SCMP_ACT_NOTIFY"}]}, "action"),
        ({"syscalls": [{"names": ["getpid"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 0, "value": 1, "op": "SCMP_CMP_LIKE"}]}]}, "op"),
    ],
)
def test_a_profile_bwrap_cannot_load_as_said_is_refused(change, key):
    with pytest.raises(QuineboxError) as refused:
        compile_seccomp(profile() | change)
    assert refused.value.kind == ErrorKind.UNSUPPORTED and key in refused.value.fields


def test_the_filter_compiles_to_a_bpf_program():
    program = compile_seccomp(profile())
    assert len(program) % 8 == 0 and 100 <= len(program) // 8 <= 4096  # sock_filter instructions; the kernel's cap is 4096
    assert program == compile_seccomp(profile())
    assert compile_seccomp(profile("rw:/src=/work")) != program != compile_seccomp(profile("syscall:ptrace"))


#: Each call and what the box gets: 0 (it ran), or the errno the profile answers. x86_64's numbers.
PROBE = """
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def call(nr, *args):
    return 0 if libc.syscall(nr, *args) >= 0 else ctypes.get_errno()
print(json.dumps({"clone3": call(435, 0, 0), "ptrace": call(101, 0, 0, 0, 0), "unshare": call(272, 0x10000000), "packet": call(41, 17, 3, 0),
                  "mkdir_setuid": call(83, b"/tmp/s", 0o4755), "mkdir": call(83, b"/tmp/p", 0o755), "getpid": call(39)}))
"""
EPERM, ENOSYS = 1, 38


def run_under(program: bytes | None, *argv: str) -> subprocess.CompletedProcess:
    """argv in a bwrap of the host's root (read-only, /tmp its own: the host's python3 runs, not a venv under /tmp), `program`
    its seccomp filter if any."""
    bwrap_bin = shutil.which("bwrap")
    assert bwrap_bin, "bwrap is not installed: apt-get install bubblewrap (scripts/setup.sh installs it)"
    base = [bwrap_bin, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    if program is None:
        return subprocess.run([*base, "--", *argv], capture_output=True, text=True, timeout=30)
    read, write = os.pipe()
    os.write(write, program)  # a few KiB: within a pipe's buffer
    os.close(write)
    try:
        return subprocess.run([*base, "--seccomp", str(read), "--", *argv], pass_fds=(read,), capture_output=True, text=True, timeout=30)
    finally:
        os.close(read)


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the probe's syscall numbers are x86_64's")
@pytest.mark.parametrize(
    "grants, expected",
    [
        ((), {"clone3": ENOSYS, "ptrace": EPERM, "unshare": EPERM, "packet": EPERM, "mkdir_setuid": 0, "mkdir": 0, "getpid": 0}),
        (("rw:/src=/work",), {"clone3": ENOSYS, "ptrace": EPERM, "unshare": EPERM, "packet": EPERM, "mkdir_setuid": EPERM, "mkdir": 0, "getpid": 0}),
    ],
)
def test_the_kernel_refuses_what_the_profile_denies_under_bwrap(grants, expected):
    program = compile_seccomp(profile(*grants))
    assert run_under(program, "/bin/true").returncode == 0
    ran = run_under(program, "/usr/bin/python3", "-I", "-S", "-c", PROBE)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout) == expected
    unfiltered = run_under(None, "/usr/bin/python3", "-I", "-S", "-c", PROBE)  # the same calls without it: the filter is what refused
    assert json.loads(unfiltered.stdout)["clone3"] != ENOSYS and json.loads(unfiltered.stdout)["mkdir_setuid"] == 0



INSIDE = """
import json, os, socket
status = dict(line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\\t" in line)
def writable(path):
    try:
        open(os.path.join(path, "w"), "w").close()
        return True
    except OSError:
        return False
print(json.dumps({
    "ids": [os.getuid(), os.getgid()], "pid": os.getpid(), "host": socket.gethostname(), "cwd": os.getcwd(),
    "caps": status["CapEff"].strip() + status["CapBnd"].strip(), "nnp": status["NoNewPrivs"].strip(), "seccomp": status["Seccomp"].strip(),
    "writable": {p: writable(p) for p in ("/", "/tmp", "/world", "/dev", "/dev/shm", "/data", "/out")},
    "tmp": oct(os.stat("/tmp").st_mode & 0o7777), "env": sorted(os.environ), "sys": os.path.exists("/sys/kernel"),
    "net": sorted(os.listdir("/sys/class/net")) if os.path.exists("/sys/class/net") else [n for _, n in socket.if_nameindex()],
}))
"""


@pytest.mark.root_only  # it switches to the host id as the backend will, which only root may
def test_bwrap_runs_the_rendered_box_as_an_unprivileged_host_id():
    """The rendered options as bwrap 0.8 makes them, run as the host id `host_ids` names (the caller's switch):
    only the command differs (the host's /usr in place of the guest's runtime)."""
    assert shutil.which("bwrap"), "bwrap is not installed: apt-get install bubblewrap (scripts/setup.sh installs it)"

    top = tempfile.mkdtemp(prefix="quinebox-bwrap-test-")  # not pytest's tmp (root's 0700): the box's host id reads it
    try:
        os.chmod(top, 0o755)
        root, runtime, data, out = (os.path.join(top, name) for name in ("root", "runtime", "data", "out"))
        for path in (root, runtime, data, out, os.path.join(root, "usr")):
            os.mkdir(path)
        os.chown(out, 1000, 1000)
        for link in ("bin", "lib", "lib64"):  # an image's tree as Debian's: /bin -> usr/bin
            os.symlink(f"usr/{link}", os.path.join(root, link))
        read, write = os.pipe()
        box = bwrap_box(spec(f"ro:{data}=/data", f"rw:{out}=/out", cwd="/", lifeline=None), image=AGENT_IMAGE, runtime=runtime, seccomp=seccomp_base(),
                        arch=ARCH, image_root=root, look=image_look(root), host_ids=(1000, 1000), proc=proc_kinds(), seccomp_fd=read)
        os.write(write, compile_seccomp(box.seccomp))
        os.close(write)
        opts = box.argv[: box.argv.index("--")]
        at = opts.index(os.path.join(root, "usr"))  # the image's /usr: the host's programs in its place
        opts[at] = "/usr"
        try:
            as_host_id = ["setpriv", "--reuid", "1000", "--regid", "1000", "--clear-groups", "--"]
            ran = subprocess.run([*as_host_id, *opts, "--", "/usr/bin/python3", "-I", "-S", "-c", INSIDE],
                                 pass_fds=(read,), capture_output=True, text=True, timeout=30)
        finally:
            os.close(read)
        assert ran.returncode == 0, ran.stderr
        seen = json.loads(ran.stdout)
        assert seen | {"env": None} == {
            "ids": [1000, 1000], "pid": 1, "host": "box", "cwd": "/world", "caps": "0" * 32, "nnp": "1", "seccomp": "2", "env": None,
            "writable": {"/": False, "/tmp": True, "/world": True, "/dev": False, "/dev/shm": True, "/data": False, "/out": True},
            "tmp": "0o1777", "sys": False, "net": ["lo"],
        }
        assert seen["env"] == sorted([*env_of(oci(spec(f"ro:{data}=/data", f"rw:{out}=/out", cwd="/", lifeline=None))), "PWD"])  # bwrap's --chdir sets PWD
        assert os.listdir(out) == ["w"] and os.stat(os.path.join(out, "w")).st_uid == 1000  # written as the host id, never root
    finally:
        shutil.rmtree(top)


GETPRIORITY = """
import ctypes, json
libc = ctypes.CDLL(None, use_errno=True)
def call(*args):
    return 0 if libc.syscall(140, *args) >= 0 else ctypes.get_errno()
print(json.dumps([call(0, 0), call(1, 0), call(2, 0), call(0, 1)]))
"""
EACCES = 13


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="getpriority's number is x86_64's")
@pytest.mark.parametrize(
    "args, expected",
    [
        # one argument named twice: either condition refuses (runc's rule of a rule per condition)
        ([{"index": 0, "value": 0, "op": "SCMP_CMP_EQ"}, {"index": 0, "value": 1, "op": "SCMP_CMP_EQ"}], [EACCES, EACCES, 0, EACCES]),
        # distinct arguments: both must hold
        ([{"index": 0, "value": 0, "op": "SCMP_CMP_EQ"}, {"index": 1, "value": 0, "op": "SCMP_CMP_EQ"}], [EACCES, 0, 0, 0]),
        # a mask: which & 2 == 2
        ([{"index": 0, "value": 2, "valueTwo": 2, "op": "SCMP_CMP_MASKED_EQ"}], [0, 0, EACCES, 0]),
    ],
)
def test_argument_conditions_mean_what_they_mean_on_runc(args, expected):
    rules = {"defaultAction": "SCMP_ACT_ALLOW", "architectures": ["SCMP_ARCH_X86_64"],
             "syscalls": [{"names": ["getpriority"], "action": "SCMP_ACT_ERRNO", "errnoRet": EACCES, "args": args}]}
    ran = run_under(compile_seccomp(rules), "/usr/bin/python3", "-I", "-S", "-c", GETPRIORITY)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout) == expected


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86_64's own and its 32-bit architecture")
def test_the_profiles_architectures_and_no_other():
    """Only the architectures named: a filter for the 32-bit x86 alone kills x86_64's first call (bwrap's exec of the
    command); naming both lets it by."""
    allow = {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": []}
    assert run_under(compile_seccomp(allow | {"architectures": ["SCMP_ARCH_X86"]}), "/bin/true").returncode != 0
    assert run_under(compile_seccomp(allow | {"architectures": ["SCMP_ARCH_X86", "SCMP_ARCH_X86_64"]}), "/bin/true").returncode == 0
    both, native = (compile_seccomp(allow | {"architectures": arches}) for arches in (["SCMP_ARCH_X86", "SCMP_ARCH_X86_64"], ["SCMP_ARCH_X86_64"]))
    assert len(both) > len(native)


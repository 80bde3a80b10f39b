"""Each way a box could run here, judged from what is given (ways.py), and the engine's socket told apart (reach.py)."""

import os
import socket

import pytest

from quinebox.box.backends import reach
from quinebox.box.backends.exec_cgroups import waiting_moves
from quinebox.box.backends.oci.runtime import runtime_hint
from quinebox.box.backends.reach import Unreachable
from quinebox.box.backends.rootless import RUNSC, Refusal, cgroup_hierarchy
from quinebox.box.backends.ways import ENGINE, Way, engine_way, runtime_way
from quinebox.errors import EngineError

V1 = "cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0\ncgroup /sys/fs/cgroup/pids cgroup rw,relatime,pids 0 0\n"
HYBRID = "tmpfs /sys/fs/cgroup tmpfs rw 0 0\n" + V1 + "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n"
V2 = "proc /proc proc rw 0 0\ncgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime 0 0\n"


@pytest.mark.parametrize("mounts, hierarchy", [(V2, "v2"), (HYBRID, "hybrid"), (V1, "v1"), ("proc /proc proc rw 0 0\n", "none"), ("", "none"), ("garbage\n\n", "none")])
def test_cgroup_hierarchy(mounts, hierarchy):
    assert cgroup_hierarchy(mounts) == hierarchy


REMOUNT = "as root: mount -o remount,favordynmods {}  (until the next boot; or boot with cgroup_favordynmods=true, Linux 6.7 on)"
BOOT = "boot with cgroup_favordynmods=true (Linux 6.7 on)"
FAVOURED_V2 = V2.replace("relatime 0 0", "relatime,favordynmods 0 0")
FAVOURED_HYBRID = HYBRID.replace("cgroup2 rw,relatime", "cgroup2 rw,relatime,favordynmods")


@pytest.mark.parametrize("mounts, release, fix", [
    (V2, "6.18.0-1-amd64", REMOUNT.format("/sys/fs/cgroup")),
    (HYBRID, "6.18.0", REMOUNT.format("/sys/fs/cgroup/unified")),  # cgroup2's option frees the v1 hierarchies' moves too: one lock
    (V1, "6.1.0-27-amd64", BOOT),  # v1's mounts take no new option on remount
    (FAVOURED_V2, "6.18.0", None),
    (FAVOURED_HYBRID, "6.18.0", None),
    (V1.replace("memory 0 0", "memory,favordynmods 0 0"), "6.8.0", None),
    (V2, "6.0.0", REMOUNT.format("/sys/fs/cgroup")),
    (V2, "5.19.17", None),  # before 6.0 the lock never waited (and there is no option to give)
    (V2, "4.19.0-27-amd64", None),
    (V2, "6.18", REMOUNT.format("/sys/fs/cgroup")),  # a release without its patch number
    ("cgroup2 /sys/fs/cgroup cgroup2 rw,nofavordynmodsx 0 0\n", "6.18", REMOUNT.format("/sys/fs/cgroup")),  # a whole option, not a substring
    ("proc /proc proc rw 0 0\n", "6.18", None),  # no cgroup mounted: no box is placed in one
    ("", "6.18", None),
    ("garbage\n\n", "6.18", None),
])
def test_a_move_into_a_cgroup_waits_for_a_grace_period_unless_favordynmods(mounts, release, fix):
    assert waiting_moves(mounts, release) == fix


def fine():
    return None


def refuses():
    return "crun could not run a probe box (exit 1): cannot set memory limit"


def unasked():
    raise AssertionError("no probe box when something else already says no")


CRUN_HYBRID = ("crun refuses the hybrid cgroup hierarchy (v1 controllers, v2 beside them): crun could not run a probe box (exit 1): cannot set memory limit",
               "use runc, the default (`--runtime runc`); crun needs a pure cgroup v2 machine (kernel cmdline systemd.unified_cgroup_hierarchy=1)")
ANOTHER = "use another runtime (`--runtime runc`), or the Docker engine (`--backend docker`)"


NO_CGROUP = Refusal("no cgroup is delegated to dev", "sudo quinebox setup-user dev")


@pytest.mark.parametrize(
    "name, binary, unprivileged, docker_host, hierarchy, probe, way",
    [
        ("runc", "/usr/sbin/runc", None, "", "hybrid", fine, Way("runc", True, "runs boxes here (/usr/sbin/runc; a hardened probe box ran)")),
        ("runsc", "/usr/bin/runsc", None, "unix:///var/run/docker.sock", "v2", fine, Way("runsc", True, "runs boxes here (/usr/bin/runsc; a hardened probe box ran)")),
        ("crun", None, None, "", "hybrid", unasked, Way("crun", False, "not installed", "apt-get install crun")),
        ("runsc", None, None, "", "v2", unasked, Way("runsc", False, "not installed", "apt-get install runsc")),
        ("/opt/x/myrt", None, None, "", "v2", unasked, Way("/opt/x/myrt", False, "not installed", "apt-get install runc")),
        ("runc", "/usr/sbin/runc", NO_CGROUP, "", "hybrid", unasked, Way("runc", False, f"not root, and {NO_CGROUP.reason}", NO_CGROUP.fix)),
        ("runsc", "/usr/bin/runsc", RUNSC, "", "hybrid", unasked, Way("runsc", False, f"not root, and {RUNSC.reason}", RUNSC.fix)),
        ("runc", "/usr/sbin/runc", None, "tcp://10.0.0.1:2375", "v2", unasked,
         Way("runc", False, "the engine at tcp://10.0.0.1:2375 is remote: its images are not on this machine, and OCI boxes need them here",
             "unset DOCKER_HOST (to use this machine's engine), or unpack an image with `quinebox image load FILE`")),
        ("crun", "/usr/bin/crun", None, "", "hybrid", refuses, Way("crun", False, *CRUN_HYBRID)),
        ("crun", "/usr/bin/crun", None, "", "v2", refuses, Way("crun", False, refuses(), ANOTHER)),  # not the hierarchy: the runtime's own reason
        ("runc", "/usr/sbin/runc", None, "", "hybrid", refuses, Way("runc", False, refuses(), ANOTHER)),
    ],
)
def test_runtime_way(monkeypatch, name, binary, unprivileged, docker_host, hierarchy, probe, way):
    monkeypatch.setattr(os, "geteuid", lambda: 0)  # as_root's sudo is for the fix's user, tested below
    assert runtime_way(name, binary=binary, unprivileged=unprivileged, docker_host=docker_host, hierarchy=hierarchy, probe=probe) == way


def test_a_missing_runtime_is_installed_through_sudo_by_a_user(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert runtime_way("crun", binary=None, unprivileged=NO_CGROUP, docker_host="", hierarchy="v2", probe=unasked).fix == "sudo apt-get install crun"


GOOD_INFO = {"SecurityOptions": ["name=seccomp,profile=default"], "MemoryLimit": True, "PidsLimit": True}
VERSION = {"Version": "20.10.24", "ApiVersion": "1.41"}
AT = "unix:///var/run/docker.sock"
WHAT = f"20.10.24 (API 1.41) at {AT}"


def answers(info):
    return lambda: (info, VERSION, AT)


def fails(exc):
    def answer():
        raise exc
    return answer


@pytest.mark.parametrize(
    "blocked, answer, way",
    [
        (None, answers(GOOD_INFO), Way(ENGINE, True, f"{WHAT}: seccomp, memory and pids limits")),
        (Unreachable("permission denied on /var/run/docker.sock: …", "ask for the docker group"), fails(AssertionError("not asked")),
         Way(ENGINE, False, "permission denied on /var/run/docker.sock: …", "ask for the docker group")),
        (None, fails(EngineError("the Docker engine did not answer its version in time")),
         Way(ENGINE, False, "the Docker engine did not answer its version in time", "restart the engine, or check DOCKER_HOST")),
        (None, fails(ConnectionResetError("reset")), Way(ENGINE, False, "did not answer: reset", "restart the engine")),
        (None, answers({**GOOD_INFO, "SecurityOptions": ["name=apparmor"]}),
         Way(ENGINE, False, f"{WHAT} has no seccomp", "use a Docker engine built with seccomp and a kernel with CONFIG_SECCOMP_FILTER")),
        (None, answers({**GOOD_INFO, "MemoryLimit": False}),
         Way(ENGINE, False, f"{WHAT} cannot limit memory", "enable the memory cgroup controller (kernel cmdline cgroup_enable=memory)")),
        (None, answers({**GOOD_INFO, "PidsLimit": False}), Way(ENGINE, False, f"{WHAT} cannot limit pids", "enable the pids cgroup controller")),
    ],
)
def test_engine_way(blocked, answer, way):
    assert engine_way(blocked=blocked, answer=answer) == way


@pytest.mark.parametrize(
    "docker_host, path",
    [(None, "/var/run/docker.sock"), ("", "/var/run/docker.sock"), ("unix:///run/user/1000/docker.sock", "/run/user/1000/docker.sock"),
     ("unix://", "/var/run/docker.sock"), ("tcp://10.0.0.1:2375", None), ("ssh://me@host", None)],
)
def test_engine_socket(monkeypatch, docker_host, path):
    if docker_host is None:
        monkeypatch.delenv("DOCKER_HOST", raising=False)
    else:
        monkeypatch.setenv("DOCKER_HOST", docker_host)
    assert reach.engine_socket() == path


def test_a_socket_that_accepts_is_reachable(tmp_path):
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(tmp_path / "d.sock"))
        server.listen()
        assert reach.unreachable(str(tmp_path / "d.sock")) is None


def test_no_socket_is_an_engine_not_running_or_not_installed(monkeypatch, tmp_path):
    stale = tmp_path / "stale.sock"  # left by an engine that died: connecting is refused
    with socket.socket(socket.AF_UNIX) as dead:
        dead.bind(str(stale))
    monkeypatch.setattr(reach, "DOCKERD_PATHS", (str(tmp_path / "dockerd"),))
    for path in (str(tmp_path / "none.sock"), str(stale)):
        assert reach.unreachable(path).reason == "not installed"
    (tmp_path / "dockerd").write_text("#!/bin/sh\n")
    (tmp_path / "dockerd").chmod(0o755)
    for path in (str(tmp_path / "none.sock"), str(stale)):
        found = reach.unreachable(path)
        assert found.reason == f"installed but not running (nothing listens on {path})"
        assert found.fix.startswith("start it: `") and found.fix.endswith(", or point DOCKER_HOST at the socket it listens on")


def test_a_remote_engine_is_not_judged_by_its_socket(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "tcp://10.0.0.1:2375")
    assert reach.unreachable() is None


@pytest.mark.parametrize("name, package", [("runc", "runc"), ("crun", "crun"), ("runsc", "runsc"), ("/opt/x/myrt", "runc")])
def test_a_missing_runtime_is_told_its_own_package(name, package):
    assert runtime_hint(name) == f"install it (`apt-get install {package}`), name another with --runtime, or use --backend docker"

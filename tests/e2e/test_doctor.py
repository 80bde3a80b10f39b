"""`quinebox doctor` as a user runs it: each way a box could run here, the default's readiness, the exit status;
and as a user who may not use the engine's socket (a real non-root user with no docker group)."""

import grp
import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest


pytestmark = pytest.mark.root_only  # it makes users and judges the engine's socket for them

QUINEBOX = str(Path(sys.executable).with_name("quinebox"))
REPO = Path(__file__).resolve().parents[2]
#: Made by these tests when missing (and left: the next run finds it), in no group but its own.
USER = "quinebox-test-user"
NO_ENGINE = "unix:///nonexistent/docker.sock"


def chosen(**settings: str) -> dict:
    """This environment with the backend and runtime these tests ask for, and none other (a pass of
    scripts/test.sh may pin one)."""
    env = {k: v for k, v in os.environ.items() if k not in ("QUINEBOX_BACKEND", "QUINEBOX_RUNTIME")}
    return {**env, **settings}


def doctor(**settings: str) -> tuple[int, list[str]]:
    done = subprocess.run([QUINEBOX, "doctor"], capture_output=True, timeout=120, env=chosen(**settings))
    return done.returncode, done.stderr.decode().splitlines()


def line(lines: list[str], start: str) -> str:
    """The line saying `start` (after its mark), with the fix under it."""
    for i, text in enumerate(lines):
        if text[5:].startswith(start):
            return "\n".join([text] + ([lines[i + 1]] if i + 1 < len(lines) and lines[i + 1].startswith("      → ") else []))
    raise AssertionError(f"no line starting {start!r} in:\n" + "\n".join(lines))


@pytest.mark.parametrize("backend, default", [(None, "boxes run on bwrap (bubblewrap), the fastest backend that holds this box here"),
                                              ("oci", "the OCI backend was asked for (runc)"), ("docker", "the Docker backend was asked for")])
def test_doctor_passes_here_and_lists_every_way(engine, backend, default):
    code, lines = doctor(**({"QUINEBOX_BACKEND": backend} if backend else {}))
    assert code == 0, lines
    assert not [text for text in lines if text.startswith("FAIL")], lines
    assert line(lines, "runc: ").startswith("ok   runc: runs boxes here (")
    assert line(lines, "runsc (gVisor): ").startswith("ok   runsc (gVisor): runs boxes here (")
    assert line(lines, "Docker engine: ").startswith("ok   Docker engine: ") and "seccomp, memory and pids limits" in line(lines, "Docker engine: ")
    crun = line(lines, "crun: ")
    if shutil.which("crun") is None and not os.path.exists("/usr/bin/crun"):
        assert crun == "no   crun: not installed\n      → apt-get install crun"
    assert line(lines, "default: ") == f"ok   default: {default}"
    assert line(lines, "bwrap (bubblewrap): ") == f"ok   bwrap (bubblewrap): runs boxes here ({shutil.which('bwrap')}; a hardened probe box ran)"
    # which backend auto picks here, whatever the default is, and why
    assert line(lines, "auto: ") == "note auto: boxes run on bwrap (bubblewrap), the fastest backend that holds this box here (bwrap, the fastest backend where it is usable, is usable here)"
    # whether a box's start waits for its move into its cgroup here, and the one command that stops it
    mounts = [fields for fields in (text.split() for text in open("/proc/self/mounts")) if fields[2] in ("cgroup", "cgroup2")]
    if any("favordynmods" in fields[3].split(",") for fields in mounts):
        assert line(lines, "cgroup moves: ") == "ok   cgroup moves: a box's start does not wait for the kernel to move its first process into its cgroup"
    else:
        [unified] = [fields[1] for fields in mounts if fields[2] == "cgroup2"]
        assert line(lines, "cgroup moves: ") == (
            "no   cgroup moves: each box's start waits ~10 ms for the kernel to move its first process into its cgroup (an RCU grace period)\n"
            f"      → as root: mount -o remount,favordynmods {unified}  (until the next boot; or boot with cgroup_favordynmods=true, Linux 6.7 on); "
            "forks and exits then cost a little more")
    if backend == "docker":
        assert line(lines, "image ").startswith("ok   image quinebox/agent:") and line(lines, "guest runtime ").startswith("ok   guest runtime for any image at /")


def test_an_engine_not_running_is_told_to_start_and_fails_doctor_only_when_it_is_the_default(engine):
    state = tempfile.mkdtemp(prefix="quinebox-doctor-state-")
    nowhere = tempfile.mkdtemp(prefix="quinebox-doctor-shared-")  # a shared image cache holding nothing
    try:
        code, lines = doctor(DOCKER_HOST=NO_ENGINE, QUINEBOX_STATE_DIR=state, QUINEBOX_SHARED_IMAGES=nowhere)
        said = line(lines, "Docker engine: ")
        assert said.startswith("no   Docker engine: installed but not running (nothing listens on /nonexistent/docker.sock)\n      → start it: `"), said
        assert code == 1, lines  # bwrap, the default, works, but the agent image is neither unpacked, nor shared, nor to be had
        image = line(lines, "image ")
        assert image.startswith("FAIL image quinebox/agent:") and "the engine builds it, and installed but not running" in image, image
        unpacked = subprocess.run([QUINEBOX, "exec", "--", "true"], capture_output=True, timeout=60, env=chosen(QUINEBOX_STATE_DIR=state))
        assert unpacked.returncode == 0, unpacked.stderr
        code, lines = doctor(DOCKER_HOST=NO_ENGINE, QUINEBOX_STATE_DIR=state)
        assert code == 0, lines  # an unpacked image needs no engine
        assert line(lines, "image ").startswith("ok   image quinebox/agent:") and "unpacked for OCI boxes" in line(lines, "image ")
    finally:
        shutil.rmtree(state, ignore_errors=True)
        shutil.rmtree(nowhere, ignore_errors=True)
    code, lines = doctor(DOCKER_HOST=NO_ENGINE, QUINEBOX_BACKEND="docker")
    assert code == 1
    assert line(lines, "default: ").startswith("FAIL default: the Docker backend was asked for; and the Docker engine cannot run boxes here: installed but not running")


@pytest.fixture(scope="module")
def user():
    """USER, made when missing (as root); never in the docker group, so the engine's socket refuses it."""
    if os.geteuid() != 0:
        pytest.fail("these tests make a non-root user: run them as root (scripts/test.sh does)", pytrace=False)
    try:
        pwd.getpwnam(USER)
    except KeyError:
        made = subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", USER], capture_output=True, timeout=30)
        assert made.returncode in (0, 9), made.stderr  # 9: another run made it meanwhile
    docker = grp.getgrnam("docker")
    assert USER not in docker.gr_mem and pwd.getpwnam(USER).pw_gid != docker.gr_gid
    assert runs_as(USER, ["test", "-r", str(REPO / "quinebox" / "client.py")]), f"{USER} cannot read {REPO}: make it and its parents o+rx"
    return USER


def runs_as(user: str, argv: list[str]) -> bool:
    return subprocess.run(["runuser", "-u", user, "--", *argv], capture_output=True, timeout=30).returncode == 0


def user_python(user: str) -> tuple[str, str]:
    """(an interpreter `user` may run, the PYTHONPATH it needs): the venv's own when it may, else this machine's
    Python of the same version with the venv's packages (a venv of a Python under /root, which is 0700)."""
    if runs_as(user, [sys.executable, "-c", "import quinebox"]):
        return sys.executable, str(REPO)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (f"/usr/bin/{version}", f"/usr/local/bin/{version}"):
        if os.access(candidate, os.X_OK) and runs_as(user, [candidate, "-c", "pass"]):
            return candidate, f"{REPO}:{sysconfig.get_paths()['purelib']}"
    pytest.fail(f"{user} can run neither {sys.executable} nor a system {version}: install {version}, or make the venv's Python o+rx", pytrace=False)


@pytest.fixture
def home(user):
    made = tempfile.mkdtemp(prefix="quinebox-doctor-")
    os.chown(made, pwd.getpwnam(user).pw_uid, pwd.getpwnam(user).pw_gid)
    yield made
    shutil.rmtree(made, ignore_errors=True)


def as_user(user: str, home: str, *args: str) -> subprocess.CompletedProcess:
    """`quinebox ARGS` as `user`, as the console script runs it, with nothing of this process's environment."""
    python, path = user_python(user)
    env = ["env", "-i", "PATH=/usr/local/bin:/usr/bin:/bin", f"HOME={home}", f"QUINEBOX_STATE_DIR={home}/state",
           f"XDG_CONFIG_HOME={home}/config", f"PYTHONPATH={path}", "QUINEBOX_SERVE=manual"]  # no server outliving home
    script = "import sys; from quinebox.client import main; sys.argv[0] = 'quinebox'; sys.exit(main())"
    return subprocess.run(["runuser", "-u", user, "--", *env, python, "-c", script, *args], capture_output=True, timeout=120)


def test_a_user_without_the_engines_socket_is_told_permission_not_to_start_it(engine, user, home):
    done = as_user(user, home, "doctor")
    lines = done.stderr.decode().splitlines()
    assert done.returncode == 1, lines
    said = line(lines, "Docker engine: ")
    assert said.startswith(f"no   Docker engine: permission denied on /var/run/docker.sock: the engine runs, but user {user} may not use its socket"), said
    assert f"sudo usermod -aG docker {user}" in said and "OCI runtime" in said and "start" not in said
    for name in ("runc", "runsc"):  # a user with no cgroup delegated (CI's rootless pass has its own user, who has one)
        said = line(lines, f"{name}").split(": ", 1)[1]  # with its fix, on the line below
        assert said.startswith("not root, and no cgroup") and f"delegated to {user}" in said and (f"setup-user {user}" in said or "systemd" in said), lines
    said = line(lines, "bwrap (bubblewrap): ")  # the id bwrap would run as has user namespaces here; no cgroup to place its boxes in
    assert said.startswith(f"no   bwrap (bubblewrap): not root, and no cgroup is delegated to {user}") and said.count("\n") == 1, said
    assert f"setup-user {user}" in said or "systemd" in said, said
    assert line(lines, "default: ").startswith("FAIL default: boxes run on the Docker engine: not root, and no cgroup")
    assert "permission denied on /var/run/docker.sock" in line(lines, "default: ")


def test_exec_as_that_user_says_permission_in_one_line(engine, user, home):
    done = as_user(user, home, "exec", "--", "true")
    assert done.returncode == 125
    assert done.stderr.count(b"\n") == 1, done.stderr
    assert done.stderr.startswith(b"quinebox: cannot reach the Docker engine: permission denied on /var/run/docker.sock"), done.stderr
    assert b"docker group" in done.stderr


def test_a_box_bwrap_could_not_start_is_remembered_as_bwraps_failure_not_the_engines(engine, tmp_path):
    env = chosen(QUINEBOX_STATE_DIR=str(tmp_path / "state"), QUINEBOX_BACKEND="bwrap", QUINEBOX_SERVE="off")
    done = subprocess.run([QUINEBOX, "exec", "-w", "/world/no/such", "--", "true"], capture_output=True, timeout=60, env=env)
    assert (done.returncode, done.stdout) == (125, b""), done.stderr
    said = done.stderr.decode()
    assert said.count("\n") == 1 and "its user cannot enter its working directory /world/no/such" in said, said
    _, lines = doctor(QUINEBOX_STATE_DIR=str(tmp_path / "state"))
    [noted] = [text for text in lines if "failed quinebox" in text]
    assert noted.startswith("note ") and " bwrap failed quinebox: bwrap could not start the box: its user cannot enter" in noted, noted


def test_as_root_doctor_says_whose_ids_a_box_runs_as_on_each_backend(engine):
    """A root-made box on runc has host ids of its own (backends/oci/idmap.py); on an engine that does not remap
    users it runs as host uid 1000, which doctor says in one line with the fix (issue 52)."""
    from quinebox.box.backends.oci import idmap

    code, lines = doctor()
    assert code == 0, lines
    assert line(lines, "running as root: a box on runc runs in a user namespace of its own").endswith(
        f"quinebox's range {idmap.BASE}…{idmap.BASE + idmap.SLOTS * idmap.SPAN - 1} (no account's; its children share it): rw: grants must be writable "
        "by it (e.g. mode 1777, or an ACL); gVisor's boxes are its sandbox's")
    remaps = subprocess.run(["docker", "info", "--format", "{{json .SecurityOptions}}"], capture_output=True, text=True, timeout=60)
    if "name=userns" in remaps.stdout:
        assert line(lines, "the Docker engine remaps users").startswith("no   ")
    else:
        said = line(lines, "the Docker engine runs boxes without a user namespace")
        assert said.startswith("no   the Docker engine runs boxes without a user namespace: a root-made box on it runs as host uid 1000"), said
        assert "→ use bwrap or runc (auto's choice wherever either runs), whose boxes have host ids of their own" in said

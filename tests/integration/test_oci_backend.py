"""The OCI-runtime backend on the real runtimes: what the engine gave, given with no engine on the box's path.

Each test says which backend and runtime it means (QUINEBOX_BACKEND / QUINEBOX_RUNTIME), so the file means
the same whatever the suite's default is.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from commands import BOX_UID
from live_boxes import cgroups_of, local_boxes

import quinebox
from quinebox.state import run_dir, state_dir

QUINEBOX = str(Path(sys.executable).with_name("quinebox"))
#: What a box's start must never import: the engine's client and what it drags in, and what only other commands use.
HEAVY = ("docker", "requests", "urllib3", "rich", "yaml", "openai", "cryptography", "ray")


@pytest.fixture
def oci(monkeypatch, engine):
    """Boxes on runc; the engine is there only to unpack the agent image the first time."""
    monkeypatch.setenv("QUINEBOX_BACKEND", "oci")
    monkeypatch.setenv("QUINEBOX_RUNTIME", "runc")
    quinebox.exec(["true"])  # the agent image unpacked once, so every test below starts with no engine call


def cli(*argv: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([QUINEBOX, *argv], capture_output=True, timeout=60, **kwargs)




def test_the_channels_are_byte_exact_and_the_status_passes(oci):
    data = os.urandom(1 << 20) + b"\0\r\n\xff"
    result = quinebox.exec(["sh", "-c", "cat; printf 'to stderr' >&2; exit 7"], input=data)
    assert (result.returncode, result.stdout, result.stderr) == (7, data, b"to stderr")


def test_the_box_holds_the_callers_own_pipe(oci):
    """No relay: the box's stdout is the very pipe the caller gave it (same inode), so bytes move at pipe speed."""
    read_end, write_end = os.pipe()
    proc = quinebox.Popen(["readlink", "/proc/self/fd/1"], stdin=quinebox.DEVNULL, stdout=write_end)
    os.close(write_end)
    shown = os.read(read_end, 200)
    assert proc.wait() == 0
    assert shown.strip() == f"pipe:[{os.fstat(read_end).st_ino}]".encode()
    os.close(read_end)


def test_oom_time_limit_and_a_gone_reader_end_as_on_the_engine(oci):
    hog = quinebox.exec(["python3", "-c", "b = bytearray(256 << 20)"], grants=["mem:64m"])
    assert (hog.returncode, hog.oom_killed) == (137, True)
    slow = quinebox.exec(["sleep", "30"], timeout="1s")
    assert (slow.returncode, slow.timed_out) == (124, True)
    piped = subprocess.run(f"{QUINEBOX} exec -- yes | head -c 3; exit ${{PIPESTATUS[0]}}", shell=True, executable="/bin/bash", capture_output=True, timeout=60)
    assert (piped.returncode, piped.stdout) == (141, b"y\ny")


def test_the_kernel_refuses_what_the_policy_refuses(oci):
    script = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.unshare(0x10000000), ctypes.get_errno())\nprint(os.getuid(), len(os.listdir('/sys/class/net')))"
    )
    result = quinebox.exec(["python3", "-c", script])
    assert result.stdout == f"-1 1\n{BOX_UID} 1\n".encode(), result.stderr  # unshare(CLONE_NEWUSER): EPERM from seccomp; the box's uid; only lo
    assert quinebox.exec(["sh", "-c", "echo x > /etc/x"]).returncode != 0  # a read-only root


def boxes_of(session: str) -> list[dict]:
    return [c for c in local_boxes() if c["Labels"]["io.quinebox.session"] == session]


def sleeper() -> tuple[subprocess.Popen, str]:
    """A `quinebox exec -- sleep 300` of its own, and its box's session once the box is there."""
    proc = subprocess.Popen([QUINEBOX, "exec", "--", "sleep", "300"], stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while not (mine := [c for c in local_boxes() if c["Command"].endswith("-- sleep 300")]) and time.monotonic() < deadline:
        time.sleep(0.05)  # an earlier test's box may still be on its way out meanwhile: its remains go after its end
    if len(mine) != 1:
        proc.kill()  # its keeper removes the box
        proc.wait()
        pytest.fail(f"expected one box of `exec -- sleep 300`, found {len(mine)}")
    return proc, mine[0]["Labels"]["io.quinebox.session"]


def test_sigkill_of_quinebox_leaves_nothing_within_a_second(oci):
    proc, session = sleeper()
    assert cgroups_of(session)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed = time.monotonic()
    while (boxes_of(session) or cgroups_of(session)) and time.monotonic() < killed + 1.0:
        time.sleep(0.02)
    assert boxes_of(session) == [] and cgroups_of(session) == []
    assert not (run_dir() / f"{session}.oci").exists()
    assert not list((state_dir() / "oci" / "runc").glob(f"quinebox-{session}"))


def test_gc_sweeps_what_a_crash_of_everything_left(oci):
    """quinebox and its keeper both gone (as after a crash of the machine): gc removes the runtime's state and the bundle."""
    proc, session = sleeper()
    keepers = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _keeper_of(p, proc.pid)]
    assert len(keepers) == 1
    for pid in keepers:
        os.kill(pid, signal.SIGKILL)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 5
    while any(c["State"] == "running" for c in boxes_of(session)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [c["State"] for c in boxes_of(session)] in ([], ["stopped"])  # the lifeline ended its processes
    done = cli("gc")
    assert done.returncode == 0, done.stderr
    assert boxes_of(session) == [] and cgroups_of(session) == []
    assert not (run_dir() / f"{session}.oci").exists()


def _keeper_of(proc: Path, owner: int) -> bool:
    """Whether /proc/PID is the keeper that `owner` forked (named so, its parent the owner)."""
    try:
        stat = (proc / "stat").read_text()
    except OSError:
        return False
    name, _, rest = stat.partition(") ")
    return name.endswith("(quinebox-keeper") and int(rest.split()[1]) == owner


def test_ps_enter_and_kill_see_a_runtime_box(oci):
    proc = quinebox.Popen(["sleep", "60"], stdin=quinebox.DEVNULL)
    try:
        listed = cli("ps")
        assert proc.session.encode() in listed.stdout and b"sleep 60" in listed.stdout
        entered = cli("enter", proc.session, "--", "sh", "-c", "id -u; cat /proc/1/cmdline | tr '\\0' ' '")
        assert entered.returncode == 0, entered.stderr
        assert entered.stdout.startswith(f"{BOX_UID}\n".encode()) and b"/.quinebox/bin/init -- sleep 60" in entered.stdout  # its native init
        assert cli("kill", proc.session).returncode == 0
        assert proc.wait(10) == 137
    finally:
        proc.kill()
        proc.wait()


def test_a_box_of_an_unpacked_image_starts_with_the_engine_unreachable(oci, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    result = quinebox.exec(["sh", "-c", "echo no engine needed"])
    assert (result.returncode, result.stdout) == (0, b"no engine needed\n")
    done = cli("exec", "--", "true", env={**os.environ, "QUINEBOX_SERVE": "off"})
    assert done.returncode == 0, done.stderr


def test_the_hot_path_imports_no_engine_client(oci):
    # the Python client's path (`quinebox` may be the native client, bin/quinebox.c: no interpreter to ask)
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "quinebox", "exec", "--", "true"], capture_output=True, timeout=60,
                          env={**os.environ, "QUINEBOX_SERVE": "off"})
    assert done.returncode == 0, done.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.decode().splitlines() if line.startswith("import time:")}
    assert "quinebox.box.process" in imported  # the measurement saw the box start
    assert {name for name in imported if name.split(".")[0] in HEAVY} == set()


@pytest.mark.root_only  # its net:bridge box goes to the engine
def test_verbose_and_json_say_where_the_box_ran(oci, monkeypatch):
    done = cli("exec", "-v", "--json", "--", "true")
    assert done.returncode == 0
    assert b"quinebox: the OCI backend was asked for (runc)" in done.stderr
    assert json.loads(done.stderr.splitlines()[-1])["backend"] == "runc"
    monkeypatch.delenv("QUINEBOX_RUNTIME")
    bridged = cli("exec", "-v", "-g", "net:bridge", "--", "true")
    assert bridged.returncode == 0, bridged.stderr
    assert b"this box runs on the Docker engine: net:bridge needs the engine's bridge network" in bridged.stderr


def test_a_named_runtime_that_cannot_run_boxes_is_one_line_and_125(oci, tmp_path):
    fake = tmp_path / "brokenrt"
    fake.write_text("#!/bin/sh\necho 'this runtime refuses' >&2\nexit 1\n")
    fake.chmod(0o755)
    done = cli("exec", "--backend", "auto", "--runtime", str(fake), "--", "true")
    assert done.returncode == 125
    assert done.stderr.count(b"\n") == 1 and b"this runtime refuses" in done.stderr
    assert cli("exec", "--backend", "nope", "--", "true").returncode == 2


#: What runc 1.1 logs when a box's `runc init` is gone before its first word to runc.
LOST_LINE = json.dumps({"level": "error", "msg": "runc run failed: unable to start container process: waiting for init preliminary setup: read init-p: connection reset by peer"})


def losing_runc(tmp_path: Path, losses: int) -> tuple[Path, Path]:
    """runc, but for its first `losses` starts, which lose the box's init before its first word as CI saw runc's
    do under load: runc's own log line, exit 1, nothing made. Named runc (quinebox's flags and state for runc)."""
    starts = tmp_path / "starts"
    wrapper = tmp_path / "runc"
    wrapper.write_text(f"""#!/bin/sh
log=; prev=
for arg; do [ "$prev" = --log ] && log=$arg; prev=$arg; done
for arg; do
    if [ "$arg" = run ]; then
        echo start >> {starts}
        if [ "$(wc -l < {starts})" -le {losses} ]; then
            echo '{LOST_LINE}' >> "$log"
            exit 1
        fi
    fi
done
exec {shutil.which("runc")} "$@"
""")
    wrapper.chmod(0o755)
    return wrapper, starts


def test_a_start_whose_init_runc_lost_is_made_again_once(oci, tmp_path):
    """Nothing of a box ran when runc lost its init before its first word: the box is started anew, once."""
    wrapper, starts = losing_runc(tmp_path, losses=1)
    env = {**os.environ, "QUINEBOX_SERVE": "off"}
    done = cli("exec", "--runtime", str(wrapper), "--", "sh", "-c", "echo made; exit 3", env=env)
    assert (done.returncode, done.stdout, done.stderr) == (3, b"made\n", b"")
    assert starts.read_text() == "start\n" * 2
    (tmp_path / "always").mkdir()
    wrapper, starts = losing_runc(tmp_path / "always", losses=99)
    done = cli("exec", "--runtime", str(wrapper), "--", "echo", "never", env=env)
    assert (done.returncode, done.stdout) == (125, b"")
    assert done.stderr.count(b"\n") == 1 and b"waiting for init preliminary setup" in done.stderr
    assert starts.read_text() == "start\n" * 2  # tried twice, no more


#: What gVisor's kernel says it is (this host's is 6.x).
GVISOR_VERSION = b"Linux version 4.4.0 #1 SMP Sun Jan 10 15:06:54 PST 2016"


@pytest.mark.root_only  # gVisor is refused to a rootless user here (rootless.RUNSC)
def test_gvisor_runs_the_same_box(oci, monkeypatch):
    monkeypatch.setenv("QUINEBOX_RUNTIME", "runsc")
    result = quinebox.exec(["sh", "-c", "cat; cat /proc/version; id -u"], input=b"material\n")  # dmesg: syslog is refused there too
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(b"material\n" + GVISOR_VERSION) and result.stdout.endswith(b"1000\n")
    slow = quinebox.exec(["sleep", "30"], timeout="1s")
    assert (slow.returncode, slow.timed_out) == (124, True)


@pytest.mark.root_only  # gVisor is refused to a rootless user here (rootless.RUNSC)
def test_a_policy_can_require_gvisor(oci, tmp_path, monkeypatch):
    monkeypatch.delenv("QUINEBOX_RUNTIME")
    policy = tmp_path / "gvisor.yaml"
    policy.write_text("runtime: runsc\ngrants: []\n")
    result = quinebox.exec(["cat", "/proc/version"], policy=str(policy))
    assert result.returncode == 0 and result.stdout.startswith(GVISOR_VERSION)
    with pytest.raises(quinebox.QuineboxError, match="cannot run this box: net:bridge"):
        quinebox.exec(["true"], policy=str(policy), grants=["net:bridge"])


def test_an_image_from_a_docker_save_tarball(oci, tmp_path, test_images):
    from images import BUSYBOX

    archive = tmp_path / "busybox.tar"
    subprocess.run(["docker", "save", "-o", str(archive), BUSYBOX.name], check=True, timeout=60)
    loaded = cli("image", "load", str(archive))
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.split()[0] == BUSYBOX.name.encode()
    result = quinebox.exec([BUSYBOX.probe, "say", "from the tarball", "-"], image=BUSYBOX.name)
    assert (result.returncode, result.stdout) == (0, b"from the tarball\n")


def test_a_process_that_starts_boxes_adopts_no_other_orphans(oci):
    """It waits for its boxes' inits as a subreaper only while it creates them: another orphan of its own goes to
    init as ever (else it would be a zombie here for good, and `gc` would take its owner for alive)."""
    quinebox.exec(["true"])
    started = subprocess.run(["sh", "-c", "sleep 5 >/dev/null & echo $!"], capture_output=True, timeout=10)
    orphan = int(started.stdout)
    try:
        parent = int(Path(f"/proc/{orphan}/stat").read_text().rsplit(")", 1)[1].split()[1])
        assert parent != os.getpid()
    finally:
        os.kill(orphan, signal.SIGKILL)


@pytest.mark.root_only  # it makes root's cgroups at the top of each hierarchy
def test_gc_takes_empty_box_cgroups_no_runtime_knows_once_a_minute_old(oci):
    """A cgroup left with no runtime state (a delete that raced a dead owner's init) goes at the next gc; one being
    made now, and one that still has a process, stay. So does the empty parent boxes once shared (/quinebox)."""
    old, new = "quinebox-0ld0ld0ld0ld", "quinebox-n3wn3wn3wn3w"
    made = [Path("/sys/fs/cgroup", h, name) for h in ("memory", "pids") for name in (old, new)]
    for group in made:
        group.mkdir()
        if group.name == old:
            os.utime(group, (time.time() - 3600,) * 2)
    shared = [Path("/sys/fs/cgroup", h, "quinebox") for h in ("memory", "pids")]
    for group in shared:
        group.mkdir(exist_ok=True)
    proc, session = sleeper()
    try:
        for group in cgroups_of(session):
            os.utime(group, (time.time() - 3600,) * 2)  # as old, but a live box's (and busy)
        done = cli("gc")
        assert done.returncode == 0, done.stderr
        assert [g.exists() for g in made] == [False, True, False, True]
        assert [g.exists() for g in shared] == [False, False]
        assert len(cgroups_of(session)) >= 2 and boxes_of(session)
    finally:
        proc.kill()
        proc.wait()
        for group in made:
            if group.exists():
                group.rmdir()


def test_a_keeper_removes_the_boxes_of_every_runtime_its_owner_used(oci):
    """One process, a box on runc and one on gVisor: SIGKILL of it, and its keeper deletes each with its own runtime."""
    script = (
        "import os, sys, quinebox\n"
        "a = quinebox.Popen(['sleep', '300'])\n"
        "os.environ['QUINEBOX_RUNTIME'] = 'runsc'\n"
        "b = quinebox.Popen(['sleep', '300'])\n"
        "print(a.session, b.session, flush=True)\n"
        "sys.stdin.read()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        sessions = proc.stdout.readline().decode().split()
        assert len(sessions) == 2
        assert sorted(box["Runtime"] for s in sessions for box in boxes_of(s)) == ["runc", "runsc"]
    finally:
        proc.kill()
        proc.wait()
    killed = time.monotonic()
    while any(boxes_of(s) or cgroups_of(s) for s in sessions) and time.monotonic() < killed + 2.0:
        time.sleep(0.02)
    assert [(boxes_of(s), cgroups_of(s)) for s in sessions] == [([], [])] * 2

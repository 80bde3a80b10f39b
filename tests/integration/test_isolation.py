"""What the kernel refuses inside a box, checked from inside the box.

The same suite runs on gVisor (scripts/test.sh), whose kernel answers some questions its own way: it has no
/sys/class/net and no cgroupfs, checks a user's permission before a mount's read-only flag, and says
NoNewPrivs only through prctl. There each case asserts gVisor's own answer, never skipped. And on bubblewrap,
the host's kernel with no /sys in the box at all (tests/backend_under_test.py): its interfaces are /proc's, its
limits its cgroup's as the host reads them, and `net:bridge` is refused in one line.
"""

import os
import subprocess
import textwrap
from pathlib import Path

import pytest
from backend_under_test import BWRAP, BWRAP_NAMED, GVISOR, host_cgroup
from commands import QUINEBOX, ROOTLESS

import quinebox

#: The network interfaces a box has: gVisor's sysfs has no /sys/class/net, bwrap's box no /sys; /proc/net/dev says the same.
INTERFACES = "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '" if GVISOR or BWRAP else "ls /sys/class/net"


def sh(script: str, **kw) -> quinebox.ExecResult:
    return quinebox.exec(["sh", "-c", script], **kw)


def test_only_loopback_exists(engine):
    assert sh(INTERFACES).stdout == b"lo\n"
    if BWRAP:  # and no sysfs to find the host's devices in
        assert sh("test -e /sys/class/net || echo no-sysfs").stdout == b"no-sysfs\n"


@pytest.mark.root_only  # net:bridge is the engine's network, which a rootless user may not reach
def test_net_bridge_gives_a_real_interface_and_other_net_grants_do_not(engine):
    if GVISOR:  # runsc runs with no network of its own: the bridge is refused in one line, nothing started
        refused = subprocess.run([QUINEBOX, "exec", "-g", "net:bridge", "--", "true"], capture_output=True, timeout=60)
        assert (refused.returncode, refused.stdout) == (125, b"")
        assert refused.stderr.count(b"\n") == 1 and b"net:bridge needs the engine's bridge network" in refused.stderr
    elif BWRAP_NAMED:  # bwrap has no engine network: refused in one line, nothing started (auto runs it on the engine)
        refused = subprocess.run([QUINEBOX, "exec", "-g", "net:bridge", "--", "true"], capture_output=True, timeout=60)
        assert (refused.returncode, refused.stdout) == (125, b""), refused.stderr
        assert refused.stderr.count(b"\n") == 1 and b"net:bridge" in refused.stderr and b"bwrap" in refused.stderr, refused.stderr
    else:
        assert b"eth0" in sh(INTERFACES, grants=["net:bridge"]).stdout
    assert sh(INTERFACES, grants=["net"]).stdout == b"lo\n"


#: /var/tmp is world-writable on the read-only root: no permission but the mount's can refuse it.
@pytest.mark.parametrize("path", ["/usr/bin/x", "/etc/x", "/x", "/.quinebox/x", "/.quinebox/guest/lifeline.py", "/var/x", "/var/tmp/x"])
def test_root_filesystem_is_read_only(engine, path):
    result = sh(f"echo x > {path}; grep -E '^[^ ]+ (/|/.quinebox) ' /proc/mounts")
    assert result.returncode == 0 and result.stderr.startswith(b"sh: 1: cannot create ")
    if GVISOR and path != "/var/tmp/x":  # gVisor checks the user's permission before the mount's flag: both hold
        assert b"Permission denied" in result.stderr
        assert [line.split()[3].split(",")[0] for line in result.stdout.decode().splitlines()] == ["ro", "ro"]
    else:
        assert b"Read-only file system" in result.stderr


@pytest.mark.parametrize("path", ["/world", "/tmp"])
def test_world_and_tmp_are_writable(engine, path):
    assert sh(f"echo x > {path}/f && cat {path}/f").stdout == b"x\n"


#: PR_GET_NO_NEW_PRIVS as /proc/self/status would say it: gVisor's has no NoNewPrivs line, and answers prctl.
NO_NEW_PRIVS = f"""; python3 -c 'import ctypes; print("NoNewPrivs:\\t%d" % ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))'"""


def test_never_root_no_capabilities_no_new_privileges(engine):
    script = "id -u; grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status"
    status = sh(script + (NO_NEW_PRIVS if GVISOR else "")).stdout.decode()
    lines = dict(line.split(":\t") for line in status.splitlines()[1:])
    if ROOTLESS and BWRAP:  # bwrap as a plain user maps one id alone, the caller's own, onto itself: never the host's root
        assert status.splitlines()[0] == str(os.getuid()) != "0"
        assert len(sh("cat /proc/self/uid_map").stdout.decode().splitlines()) == 1
    elif ROOTLESS:  # the box's uid 0 is its namespace's: the caller, never the host's root (its other ids: the user's subordinates)
        assert status.splitlines()[0] == "0"
        mapped = {int(inside): int(outside) for inside, outside, _ in (line.split() for line in sh("cat /proc/self/uid_map").stdout.decode().splitlines())}
        assert mapped[0] == os.getuid() != 0 and 0 not in mapped.values(), mapped
    else:
        assert status.splitlines()[0] != "0"
    assert lines == {"CapEff": "0000000000000000", "CapPrm": "0000000000000000", "CapBnd": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2"}


def test_ro_grant_is_readable_and_read_only(engine, tmp_path):
    (tmp_path / "notes").write_text("granted\n")
    tmp_path.chmod(0o777)  # writable to the box's user: only the mount can refuse the write
    result = sh(f"cat {tmp_path}/notes; echo x > {tmp_path}/new", grants=[f"ro:{tmp_path}"])
    assert result.stdout == b"granted\n"
    assert b"Read-only file system" in result.stderr
    assert not (tmp_path / "new").exists()


def test_rw_grant_writes_land_on_the_host(engine, tmp_path):
    tmp_path.chmod(0o777)
    result = sh("echo from-box > out", grants=[f"rw:{tmp_path}=/data"], workdir="/data")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out").read_text() == "from-box\n"


def test_cwd_inside_a_grant_is_the_working_directory(engine, tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    tmp_path.chmod(0o755)  # gVisor enters the working directory as the box's user
    monkeypatch.chdir(tmp_path / "sub")
    assert sh("pwd", grants=[f"ro:{tmp_path}"]).stdout == f"{tmp_path}/sub\n".encode()
    assert sh("pwd").stdout == b"/world\n"


def test_ungranted_host_paths_are_absent(engine, tmp_path):
    marker = tmp_path / "secret-marker"
    marker.write_text("host only")
    result = sh(f"test -e {marker} && echo present || echo absent; ls /home; test -S /var/run/docker.sock && echo sock || echo nosock")
    assert result.stdout == b"absent\nnosock\n"


def test_host_environment_is_invisible_inside(engine):
    secret = "sk-test-" + os.urandom(8).hex()
    os.environ["OPENAI_API_KEY"] = secret
    try:
        script = "env; cat /proc/1/environ /proc/self/environ; grep -rs . /proc/*/environ /proc/*/cmdline; ls -a /tmp /world"
        result = sh(script)
    finally:
        del os.environ["OPENAI_API_KEY"]
    assert result.returncode in (0, 2)
    assert secret.encode() not in result.stdout + result.stderr
    assert b"OPENAI" not in result.stdout


def test_env_grant_passes_exactly_the_named_variable(engine):
    os.environ["QB_TEST_VAR"] = "from-host"
    try:
        result = sh('echo "$QB_TEST_VAR|$FIXED"', grants=["env:QB_TEST_VAR", "env:FIXED=set"])
    finally:
        del os.environ["QB_TEST_VAR"]
    assert result.stdout == b"from-host|set\n"


#: The box's memory and process limits as it sees them: its cgroup; on gVisor (no cgroupfs), gVisor's own
#: memory size (the limit) and its process limit (RLIMIT_NPROC, which gVisor's kernel holds). bwrap's box has no
#: cgroupfs to see them in (it prints blank lines): its own cgroup holds them, read from the host while it runs.
LIMITS = (
    f"grep MemTotal /proc/meminfo | tr -s ' ' | cut -d' ' -f2 | sed 's/$/ kB/'; python3 -c 'import resource; print(resource.getrlimit(resource.RLIMIT_NPROC)[0])'"
    if GVISOR
    else "test -e /sys/fs/cgroup || { echo; echo; }"
    if BWRAP
    else "cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/pids/pids.max"
)


def memory(size: int) -> str:
    return f"{size >> 10} kB" if GVISOR else str(size)


def host_limits(session: str) -> list[str]:
    """The memory, process and CPU limits in a running box's own cgroup, as the host reads them."""
    files = (("memory", "memory.limit_in_bytes"), ("pids", "pids.max"), ("cpu", "cpu.cfs_quota_us"))
    return [Path(host_cgroup(session, controller), name).read_text().strip() for controller, name in files]


def test_limits_reach_the_cgroup(engine):
    script = f"{LIMITS}; {'cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us' if not (GVISOR or BWRAP) else 'echo'}; df -k /tmp | tail -1; sleep 30"
    proc = quinebox.Popen(["sh", "-c", script], grants=["mem:96m", "pids:40", "cpus:0.5", "tmp:32m"], stdin=quinebox.DEVNULL, stdout=quinebox.PIPE)
    try:
        out = [proc.stdout.readline().decode().strip() for _ in range(4)]
        if GVISOR:  # the CPU quota is the host's, on the cgroup the sandbox runs in
            out[2] = Path(f"/sys/fs/cgroup/cpu/quinebox-{proc.session}/cpu.cfs_quota_us").read_text().strip()
        if BWRAP:
            assert out[:3] == ["", "", ""], out  # the box sees no cgroupfs
            out[:3] = host_limits(proc.session)
    finally:
        proc.kill()
        proc.wait(10)
    assert out[:3] == [memory(96 << 20), "40", "50000"]
    assert out[3].split()[1] == str(32 << 10)


def test_policy_preset_applies(engine):
    if BWRAP:  # read from the host while the box runs
        proc = quinebox.Popen(["sh", "-c", f"{LIMITS}; echo up; sleep 30"], policy="strict", stdin=quinebox.DEVNULL, stdout=quinebox.PIPE)
        try:
            out = [proc.stdout.readline() for _ in range(3)]
            limits = host_limits(proc.session)[:2]
        finally:
            proc.kill()
            proc.wait(10)
        assert (out, limits) == ([b"\n", b"\n", b"up\n"], [str(256 << 20), "64"])
        return
    out = sh(LIMITS, policy="strict").stdout
    assert out == f"{memory(256 << 20)}\n64\n".encode()


FORK_LOOP = """
import os, time
made = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(10)
            os._exit(0)
        made += 1
except OSError as exc:
    print(made, exc.strerror)
"""


def test_a_fork_loop_meets_its_pids_limit_near_it(engine):
    """The box's own processes are what pids:N counts (on gVisor, too: not the sandbox's host helpers)."""
    result = quinebox.exec(["python3", "-c", FORK_LOOP], grants=["pids:64"], timeout=60)
    made, _, why = result.stdout.decode().strip().partition(" ")
    assert (result.returncode, why) == (0, "Resource temporarily unavailable"), result.stderr
    assert 56 <= int(made) <= 63  # the init and the loop itself count too


def test_200_processes_fit_the_default_limit(engine):
    result = sh("for i in $(seq 200); do sleep 2 & done; wait; echo done", timeout=60)
    assert (result.returncode, result.stdout, result.stderr) == (0, b"done\n", b"")


def test_fork_bomb_is_contained_and_the_next_box_works(engine):
    bomb = quinebox.exec(["sh", "-c", "b() { b | b & }; b; sleep 5"], grants=["pids:32"], timeout=8)
    assert bomb.returncode in (124, 0, 2, 137)
    host_ok = subprocess.run(["true"]).returncode
    assert host_ok == 0
    assert quinebox.exec(["echo", "next"]).stdout == b"next\n"


def test_zombies_are_reaped_by_the_init(engine):
    script = textwrap.dedent(
        """
        import os, time
        for _ in range(20):
            if os.fork() == 0:
                if os.fork() == 0:
                    os._exit(0)
                os._exit(0)
            os.wait()
        time.sleep(0.5)
        states = [open(f"/proc/{p}/stat").read().split(")")[1].split()[0] for p in os.listdir("/proc") if p.isdigit()]
        print(states.count("Z"))
        """
    )
    assert quinebox.exec(["python3", "-c", script]).stdout == b"0\n"


def test_threads_and_subprocesses_work_despite_clone3_enosys(engine):
    script = "import subprocess, threading; t = threading.Thread(target=print, args=('thread',)); t.start(); t.join(); print(subprocess.run(['echo', 'child'], capture_output=True, text=True).stdout.strip())"
    assert quinebox.exec(["python3", "-c", script]).stdout == b"thread\nchild\n"


@pytest.mark.root_only  # mounting a filesystem for the test needs root
def test_read_only_reaches_a_filesystem_mounted_below_the_grant(engine, tmp_path):
    """The engine's ro bind is not recursive: without quinebox's own ro mounts, inner/ would be writable."""
    inner = tmp_path / "inner"
    inner.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0777", "quinebox-test", str(inner)], check=True)
    try:
        tmp_path.chmod(0o755)
        (inner / "seen").write_text("x")
        result = quinebox.exec(["sh", "-c", f"cat {inner}/seen; echo y > {inner}/new"], grants=[f"ro:{tmp_path}"])
        assert result.stdout == b"x"
        assert result.returncode != 0 and b"Read-only file system" in result.stderr
        assert not (inner / "new").exists()
        writable = quinebox.exec(["sh", "-c", f"echo y > {inner}/new"], grants=[f"ro:{tmp_path}", f"rw:{inner}"])
        assert writable.returncode == 0 and (inner / "new").read_text() == "y\n"  # a grant naming it decides
    finally:
        subprocess.run(["umount", str(inner)], check=True)

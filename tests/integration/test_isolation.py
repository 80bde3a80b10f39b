"""What the kernel refuses inside a box, checked from inside the box."""

import os
import subprocess
import textwrap

import pytest

import quinebox


def sh(script: str, **kw) -> quinebox.ExecResult:
    return quinebox.exec(["sh", "-c", script], **kw)


def test_only_loopback_exists(engine):
    assert sh("ls /sys/class/net").stdout == b"lo\n"


def test_net_bridge_gives_a_real_interface_and_other_net_grants_do_not(engine):
    assert b"eth0" in sh("ls /sys/class/net", grants=["net:bridge"]).stdout
    assert sh("ls /sys/class/net", grants=["net"]).stdout == b"lo\n"


@pytest.mark.parametrize("path", ["/usr/bin/x", "/etc/x", "/x", "/.quinebox/x", "/.quinebox/guest/lifeline.py", "/var/x"])
def test_root_filesystem_is_read_only(engine, path):
    result = sh(f"echo x > {path}")
    assert result.returncode != 0
    assert b"Read-only file system" in result.stderr


@pytest.mark.parametrize("path", ["/world", "/tmp"])
def test_world_and_tmp_are_writable(engine, path):
    assert sh(f"echo x > {path}/f && cat {path}/f").stdout == b"x\n"


def test_never_root_no_capabilities_no_new_privileges(engine):
    status = sh("id -u; grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status").stdout.decode()
    lines = dict(line.split(":\t") for line in status.splitlines()[1:])
    assert status.splitlines()[0] != "0"
    assert lines == {"CapEff": "0000000000000000", "CapPrm": "0000000000000000", "CapBnd": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2"}


def test_ro_grant_is_readable_and_read_only(engine, tmp_path):
    (tmp_path / "notes").write_text("granted\n")
    tmp_path.chmod(0o755)
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


def test_limits_reach_the_cgroup(engine):
    script = "cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/pids/pids.max /sys/fs/cgroup/cpu/cpu.cfs_quota_us; df -k /tmp | tail -1"
    out = sh(script, grants=["mem:96m", "pids:40", "cpus:0.5", "tmp:32m"]).stdout.decode().split("\n")
    assert out[:3] == [str(96 << 20), "40", "50000"]
    assert out[3].split()[1] == str(32 << 10)


def test_policy_preset_applies(engine):
    out = sh("cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/pids/pids.max", policy="strict").stdout
    assert out == f"{256 << 20}\n64\n".encode()


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


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a filesystem for the test needs root")
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

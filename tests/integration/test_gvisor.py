"""A box on gVisor (`--runtime runsc`): its own kernel in front of the host's, and the same box otherwise.

gVisor's kernel answers the box's system calls itself, so what the box sees of the kernel is gVisor's (no
/sys/class/net, its own dmesg); what it may do is what any box may: the same user, no capabilities, a
read-only root, only loopback, the same limits.
"""

import pytest

import quinebox
from quinebox.box.backends.oci import policy as policy_oci


@pytest.fixture(autouse=True)
def gvisor(monkeypatch, engine):
    monkeypatch.setenv("QUINEBOX_BACKEND", "oci")
    monkeypatch.setenv("QUINEBOX_RUNTIME", "runsc")


def sh(command: str, **options) -> quinebox.ExecResult:
    return quinebox.exec(["sh", "-c", command], **options)


def test_the_box_runs_on_gvisors_kernel():
    result = sh("cat /proc/version; dmesg")  # its log is the kernel's to keep: syslog is among the profile's refusals
    assert result.stdout.startswith(b"Linux version 4.4.0 #1 SMP Sun Jan 10 15:06:54 PST 2016"), result.stdout  # gVisor's own
    assert result.stderr == b"dmesg: read kernel buffer failed: Operation not permitted\n"


def test_the_same_user_no_capabilities_and_only_loopback():
    result = sh("id -u; grep -E '^(CapEff|CapPrm|CapBnd):' /proc/self/status; tail -n +3 /proc/net/dev | cut -d: -f1")
    words = result.stdout.decode().split()
    assert words[0] == "1000"
    assert dict(zip(words[1:7:2], words[2:7:2])) == dict.fromkeys(["CapEff:", "CapPrm:", "CapBnd:"], "0000000000000000")
    assert words[7:] == ["lo"]


@pytest.mark.parametrize("path", ["/usr/bin/x", "/etc/x", "/.quinebox/x"])
def test_the_root_is_read_only(path):
    result = sh(f"echo x > {path}")  # gVisor checks the user's permission before the mount's
    assert result.returncode != 0 and (b"Read-only file system" in result.stderr or b"Permission denied" in result.stderr)
    mounts = sh("cat /proc/mounts").stdout.decode().splitlines()
    assert [line.split()[3].split(",")[0] for line in mounts if line.split()[1] in ("/", "/.quinebox")] == ["ro", "ro"]


def test_world_and_tmp_are_writable_and_the_channels_pass():
    data = bytes(range(256)) * 4096
    result = quinebox.exec(["sh", "-c", "cat > /world/f && cat /world/f && echo err >&2 && exit 5"], input=data)
    assert (result.returncode, result.stdout, result.stderr) == (5, data, b"err\n")


def test_the_time_limit_and_a_kill_end_the_box_as_on_runc():
    slow = quinebox.exec(["sleep", "30"], timeout="1s")
    assert (slow.returncode, slow.timed_out) == (124, True)
    proc = quinebox.Popen(["sleep", "30"], stdin=quinebox.DEVNULL)
    proc.kill()
    assert proc.wait(10) == 137


def test_the_boxs_seccomp_profile_and_no_new_privileges_hold_inside_the_sandbox():
    script = "import ctypes; libc = ctypes.CDLL(None); print(libc.prctl(21, 0, 0, 0, 0), libc.prctl(39, 0, 0, 0, 0))"  # PR_GET_SECCOMP, PR_GET_NO_NEW_PRIVS
    assert quinebox.exec(["python3", "-c", script]).stdout == b"2 1\n"
    refused = sh("unshare -U true; echo $?")
    assert refused.stdout == b"1\n" and b"Operation not permitted" in refused.stderr


def test_a_sandbox_that_dies_says_why_in_one_line_and_137(monkeypatch):
    """The sandbox's helpers meet the host's limit (made small here: one host task per box process allowed)."""
    monkeypatch.setattr(policy_oci, "GVISOR_TASKS_BASE", 0)
    monkeypatch.setattr(policy_oci, "GVISOR_TASKS_PER_PID", 1)
    proc = quinebox.Popen(["sh", "-c", "for i in $(seq 50); do sleep 5 & done; wait"], grants=["pids:80"], stdin=quinebox.DEVNULL,
                          stdout=quinebox.PIPE, stderr=quinebox.PIPE)
    out, err = proc.stdout.read(), proc.stderr.read()
    assert (proc.wait(60), out, err) == (137, b"", b""), proc.sandbox_died
    assert proc.sandbox_died is not None and "\n" not in proc.sandbox_died
    assert proc.sandbox_died.startswith("gVisor's sandbox died: the host refused it a resource (") and "may number 80 on the host" in proc.sandbox_died


def test_an_exec_into_a_lasting_box_says_once_that_it_runs_without_the_profile(capfd):
    """This runsc loads the profile for the box's init only: an exec beside it is weaker, and that is said, once per box."""
    with quinebox.Sandbox(runtime="runsc") as box:
        first = box.exec(["grep", "^Seccomp:", "/proc/self/status"])
        second = box.exec(["true"])
        said = capfd.readouterr().err
    assert (first.returncode, first.stdout, second.returncode) == (0, b"Seccomp:\t0\n", 0)  # what the line owns up to
    assert said.count(f"quinebox: box {box.id} is on gVisor: commands exec'd into it run without its seccomp profile") == 1, said

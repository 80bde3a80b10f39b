"""`quinebox box create/ls/rm`, `exec --in` and `cp`, run as a user runs them: a box that outlives its command."""

import glob
import os
import signal
import subprocess
import time

import pytest

from commands import QUINEBOX, qb
from live_boxes import soon


def holders() -> list[int]:
    """Live holder processes of this test session's state dir (forked `box create`s), and the keepers they fork."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue
        if b"box\0create" in cmdline and os.environ["QUINEBOX_STATE_DIR"].encode() in environ:
            found.append(int(pid))
    return found


def gone(session: str) -> bool:
    cgroups = glob.glob(f"/sys/fs/cgroup/*/quinebox-{session}") + glob.glob(f"/sys/fs/cgroup/*/quinebox.user-*/quinebox-{session}")  # a rootless box's below its user's
    return not cgroups and session.encode() not in qb("ps").stdout


@pytest.fixture(params=["oci", "docker"])
def box(request):
    made = qb("box", "create", "--backend", request.param, "--name", f"t-{request.param}", "-g", "pids:64", timeout=60)
    assert made.returncode == 0, made.stderr
    session = made.stdout.decode().strip()
    yield session
    qb("box", "rm", session)


def test_create_prints_the_id_and_ls_lists_it(box):
    assert len(box) == 12
    listed = qb("box", "ls").stdout.decode()
    assert box in listed and "t-" in listed and "holder" in listed


def test_exec_in_passes_the_five_channels(box):
    done = qb("exec", "--in", box, "--", "sh", "-c", "cat; echo err >&2; exit 9", input=b"\x00bytes\xff")
    assert (done.returncode, done.stdout, done.stderr) == (9, b"\x00bytes\xff", b"err\n")


def test_exec_in_by_name_with_cwd_env_and_user(box):
    name = qb("box", "ls").stdout.decode().split(box)[1].split()[0]
    done = qb("exec", "--in", name, "--cwd", "/tmp", "-e", "GREETING=hi there", "--user", "nobody", "--", "sh", "-c", 'pwd; echo "$GREETING"; id -un')
    assert done.stdout == b"/tmp\nhi there\nnobody\n", done.stderr
    root = qb("exec", "--in", box, "--user", "root", "--", "id", "-u")  # root only in a user namespace of the box's own
    assert (root.returncode, root.stdout) == ((125, b"") if name == "t-docker" else (0, b"0\n")), root.stderr


def test_state_lasts_between_execs_and_cp_goes_both_ways(box, tmp_path):
    assert qb("exec", "--in", box, "--", "sh", "-c", "echo kept > /world/state").returncode == 0
    assert qb("exec", "--in", box, "--", "cat", "/world/state").stdout == b"kept\n"
    source = tmp_path / "in.bin"
    source.write_bytes(bytes(range(256)))
    assert qb("cp", str(source), f"{box}:/world/copied.bin").returncode == 0
    assert qb("cp", f"{box}:/world/copied.bin", str(tmp_path / "out.bin")).returncode == 0
    assert (tmp_path / "out.bin").read_bytes() == bytes(range(256))
    missing = qb("cp", f"{box}:/world/nope", str(tmp_path / "x"))
    assert missing.returncode == 1 and b"No such file" in missing.stderr and not (tmp_path / "x").exists()


def test_exec_in_timeout_kills_the_tree_and_keeps_the_box(box):
    began = time.monotonic()
    done = qb("exec", "--in", box, "--timeout", "1", "--", "sh", "-c", "(setsid sleep 300 </dev/null >/dev/null 2>&1 &); sleep 300")
    assert done.returncode == 124 and time.monotonic() - began < 10
    assert soon(lambda: b"sleep" in qb("exec", "--in", box, "--", "sh", "-c", "cat /proc/[0-9]*/comm").stdout, within=3) is False
    assert qb("exec", "--in", box, "--", "echo", "up").stdout == b"up\n"


def test_a_killed_client_takes_its_processes_with_it(box):
    client = subprocess.Popen([QUINEBOX, "exec", "--in", box, "--", "sh", "-c", "(setsid sleep 300 </dev/null >/dev/null 2>&1 &); sleep 300"])
    deadline = time.monotonic() + 20
    while b"sleep" not in qb("exec", "--in", box, "--", "sh", "-c", "cat /proc/[0-9]*/comm").stdout:
        assert time.monotonic() < deadline, "the client's command never started"
        time.sleep(0.2)
    client.send_signal(signal.SIGKILL)
    client.wait()
    assert soon(lambda: b"sleep" in qb("exec", "--in", box, "--", "sh", "-c", "cat /proc/[0-9]*/comm").stdout, within=5) is False
    assert qb("exec", "--in", box, "--", "echo", "up").stdout == b"up\n"


def test_exec_in_refuses_what_only_a_new_box_takes(box):
    done = qb("exec", "--in", box, "-g", "net", "--", "true")
    assert done.returncode == 2 and b"fixed when it is made" in done.stderr
    unknown = qb("exec", "--in", "no-such-box", "--", "true")
    assert unknown.returncode == 125 and unknown.stderr.count(b"\n") == 1


def test_rm_removes_box_holder_and_cgroups():
    session = qb("box", "create", timeout=60).stdout.decode().strip()
    assert qb("box", "rm", session).stdout.decode().strip() == session
    assert soon(lambda: not gone(session), within=5) is False
    assert soon(holders, within=5) == []
    assert qb("box", "rm", session).returncode == 125


def test_idle_and_ttl_limits_remove_the_box():
    idle = qb("box", "create", "--idle", "2", timeout=60).stdout.decode().strip()
    ttl = qb("box", "create", "--ttl", "2", "--idle", "0", timeout=60).stdout.decode().strip()
    assert qb("exec", "--in", idle, "--", "true").returncode == 0
    assert soon(lambda: not (gone(idle) and gone(ttl)), within=15) is False
    assert soon(holders, within=5) == []


def test_a_killed_holder_takes_its_box_with_it():
    session = qb("box", "create", timeout=60).stdout.decode().strip()
    (holder,) = [pid for pid in holders() if open(f"/proc/{pid}/comm").read().strip() != "quinebox-keeper"]
    os.kill(holder, signal.SIGKILL)
    assert soon(lambda: not gone(session), within=10) is False
    assert session.encode() not in qb("box", "ls").stdout


def test_create_refuses_a_bad_grant_in_one_line_and_leaves_nothing():
    done = qb("box", "create", "-g", "rw:/etc", timeout=60)
    assert done.returncode == 125 and done.stderr.count(b"\n") == 1 and done.stdout == b""
    assert soon(holders, within=5) == []


def test_cp_of_what_the_box_planted_fails_at_once_and_the_box_stays_up(box, tmp_path):
    """A FIFO, a socket, devices behind links, and files over the cap: one line each, exit 1, no file left here."""
    python = "/.quinebox/lib/ld.so --library-path /.quinebox/lib /.quinebox/lib/python3 -I -S"
    plant = (f"mkfifo /tmp/fifo && ln -s /dev/zero /tmp/zero && head -c 3000 /dev/zero > /tmp/big && "
             f"{python} -c \"import socket; socket.socket(socket.AF_UNIX).bind('/tmp/sock')\"")
    assert qb("exec", "--in", box, "--", "sh", "-c", plant).returncode == 0
    for path, args, words in [
        ("/tmp/fifo", [], b"a FIFO, not a regular file"), ("/tmp/sock", [], b"a socket, not a regular file"),
        ("/tmp/zero", [], b"a character device, not a regular file"), ("/dev/null", [], b"a character device"),
        ("/tmp/big", ["--max-size", "2k"], b"holds 3000 bytes, more than the cap of 2048: give cp --max-size SIZE"),
    ]:
        began = time.monotonic()
        done = qb("cp", *args, f"{box}:{path}", str(tmp_path / "out"), timeout=30)
        took = time.monotonic() - began
        print(f"\nplanted cp out {box} {path}: {took:.3f} s")
        assert done.returncode == 1 and words in done.stderr and done.stderr.count(b"\n") == 1, done.stderr
        assert took < 5 and os.listdir(tmp_path) == []
    for path, words in [("/tmp/fifo", b"a FIFO"), ("/tmp/zero", b"a character device")]:
        began = time.monotonic()
        done = qb("cp", "-", f"{box}:{path}", input=b"data", timeout=30)
        print(f"\nplanted cp in {box} {path}: {time.monotonic() - began:.3f} s")
        assert done.returncode == 1 and words in done.stderr and done.stderr.count(b"\n") == 1, done.stderr
    assert qb("cp", "--max-size", "3000", f"{box}:/tmp/big", "-").stdout == b"\0" * 3000
    assert qb("cp", "--max-size", "lots", f"{box}:/tmp/big", "-").returncode == 2
    assert qb("exec", "--in", box, "--", "echo", "up").stdout == b"up\n"

"""quinebox.Sandbox on the real runtimes and engine: a box that lasts, many execs in it, its files, its end.

The backend tests run on the OCI runtime (runc, the default here) and on the Docker engine; gVisor gets the
ones whose mechanism differs there (tests/integration/test_gvisor.py covers the rest of gVisor's box).
"""

import asyncio
import io
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time

import pytest
from commands import BOX_UID, ROOTLESS
from live_boxes import cgroups_of, live_boxes, soon

import quinebox
from quinebox.box.live import sandboxes
from quinebox.box.policy import GUEST_PYTHON
from quinebox.errors import GrantError, QuineboxError

BACKENDS = [pytest.param("oci", id="runc"), pytest.param("docker", id="docker")]




@pytest.fixture(scope="module", params=BACKENDS)
def sb(request):
    with quinebox.Sandbox(backend=request.param, grants=["pids:128"]) as box:
        yield box


def test_exec_keeps_the_five_channels(sb):
    result = sb.exec(["sh", "-c", "cat; printf 'to err' >&2; exit 7"], input=b"\x00material\xff")
    assert (result.returncode, result.stdout, result.stderr) == (7, b"\x00material\xff", b"to err")
    assert result.session == sb.id and not result.timed_out


def test_exec_takes_cwd_env_and_str_input(sb):
    result = sb.exec(["sh", "-c", 'pwd; echo "$A $B"; cat'], input="é\n", cwd="/tmp", env={"A": "1", "B": "two words"})
    assert result.stdout == "/tmp\n1 two words\né\n".encode()


def test_exec_runs_as_the_box_user_or_another_and_root_only_in_a_user_namespace_of_its_own(sb):
    assert sb.exec(["id", "-u"]).stdout == b"%d\n" % BOX_UID  # a rootless box's 0 is its caller (commands.BOX_UID)
    assert sb.exec(["id", "-un"], user="nobody").stdout == b"nobody\n"
    assert sb.exec(["id", "-u"], user="4242:4242").stdout == b"4242\n"
    for root in ("root", "0", "1000:0"):  # runc's boxes have one (test_root_exec.py); the engine's none
        if sb.target.backend == "docker":
            with pytest.raises(GrantError, match="nothing in a box runs as root"):
                sb.exec(["id"], user=root)
        else:
            assert sb.exec(["id", "-u"], user=root).stdout == (b"1000\n" if root == "1000:0" else b"0\n")
    with pytest.raises(GrantError, match="no such user"):
        sb.exec(["id"], user="no-such-user")
    if ROOTLESS:  # past its user's subordinate range: refused before any process starts, in our words, not runc's
        with pytest.raises(GrantError, match=r"^refused user '4000000': this box's user namespace maps uids 0, 1-\d+ only; give one of those$"):
            sb.exec(["id"], user="4000000")


def test_missing_and_unexecutable_commands_exit_as_a_shell_says(sb):
    assert sb.exec(["no-such-command"]).returncode == 127
    assert sb.exec(["/etc/passwd"]).returncode == 126


def test_timeout_kills_the_exec_tree_and_the_box_stays_up(sb):
    began = time.monotonic()
    result = sb.exec(["sh", "-c", "(setsid sleep 300 </dev/null >/dev/null 2>&1 &); sleep 300 & echo $! > /tmp/pid; wait"], timeout=1)
    assert (result.returncode, result.timed_out) == (124, True)
    assert time.monotonic() - began < 5
    # Every sleep is gone, the setsid one (re-parented to the box's init) included; the box still answers.
    survivors = b""
    for _ in range(20):
        survivors = sb.exec(["sh", "-c", "for p in /proc/[0-9]*; do [ \"$(cut -d' ' -f3 $p/stat)\" != Z ] && cat $p/comm; done"]).stdout
        if b"sleep" not in survivors:
            break
        time.sleep(0.1)
    assert b"sleep" not in survivors
    assert sb.exec(["echo", "up"]).stdout == b"up\n"


CONTROLS = "grep -E '^(Uid|Gid|Groups|CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/{}/status"


def test_an_exec_is_the_inits_child_in_a_cgroup_of_its_own_under_every_control_of_the_box(sb):
    """The box's owner starts execs through the box's init (a fork, not a runtime's start): so each is the init's
    child, holds exactly what the box's first process holds, and is in a pids cgroup of its own."""
    parent = sb.exec(["sh", "-c", 'tr "\\0" " " </proc/$PPID/cmdline']).stdout
    assert b"/.quinebox/guest/lifeline.py" in parent
    own, first = (sb.exec(["sh", "-c", CONTROLS.format(pid)]).stdout for pid in ("self", "1"))
    if b"lifeline.py" not in sb.exec(["sh", "-c", 'tr "\\0" " " </proc/1/cmdline']).stdout:  # the engine's init is pid 1 there
        first = sb.exec(["sh", "-c", CONTROLS.format("$PPID")]).stdout
    assert own == first and b"NoNewPrivs:\t1" in own and b"Seccomp:\t2" in own and b"CapEff:\t0000000000000000" in own
    cgroups = [sb.exec(["grep", "-E", ":pids:|^0::", "/proc/self/cgroup"]).stdout for _ in range(2)]
    assert all(b"/quinebox-exec-" in cgroup for cgroup in cgroups) and cgroups[0] != cgroups[1]


#: Takes every process the box may have, and stays, taking again any that comes free: a test's own `true`, running when
#: the box was first full, frees its process as it ends, which a hog that stopped at its first EAGAIN left to every exec after.
HOG = "import os, time\nwhile True:\n    try:\n        if os.fork() == 0:\n            time.sleep(300)\n            os._exit(0)\n    except OSError:\n        time.sleep(0.01)"


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_exec_the_box_has_no_process_left_for_fails_as_a_shell_would_and_the_box_goes_on(backend):
    with quinebox.Sandbox(backend=backend, grants=["pids:12"]) as box:
        hog = box.Popen(["python3", "-c", HOG], stdin=quinebox.DEVNULL, stdout=quinebox.DEVNULL, stderr=quinebox.DEVNULL)
        deadline = time.monotonic() + 10
        while (refused := box.exec(["true"])).returncode == 0 and time.monotonic() < deadline:
            time.sleep(0.05)  # until the sleeps have taken every process the box may have
        assert refused.returncode == 126 and refused.stderr.startswith(b"quinebox: cannot start true: "), refused
        hog.kill()
        assert hog.wait(10) == 137
        assert box.exec(["echo", "up"]).stdout == b"up\n"


def test_a_background_process_outlives_its_exec_as_under_docker_exec(sb):
    sb.exec(["sh", "-c", "sleep 60 </dev/null >/dev/null 2>&1 & echo $! > /tmp/server.pid"], timeout=10)
    assert sb.exec(["sh", "-c", 'kill -0 "$(cat /tmp/server.pid)" && echo alive']).stdout == b"alive\n"


def test_a_timeout_covers_the_outputs_too_so_what_holds_them_past_it_is_killed(sb):
    """The command ends at once but leaves `sleep` holding its stdout: the exec still ends by its timeout (as
    subprocess.run's covers reading to the end), says so, keeps what came, and leaves that sleep no more."""
    began = time.monotonic()
    result = sb.exec(["sh", "-c", "sleep 37 & echo started"], timeout=2)
    assert (result.returncode, result.timed_out, result.stdout) == (124, True, b"started\n"), result
    assert time.monotonic() - began < 15  # 2 s, and the kill: never the 37 s of the sleep
    ours = "for p in /proc/[0-9]*; do [ \"$(cut -d' ' -f3 $p/stat)\" != Z ] && tr '\\0' ' ' < $p/cmdline && echo; done"
    assert soon(lambda: [line for line in sb.exec(["sh", "-c", ours]).stdout.splitlines() if line.strip() == b"sleep 37"], within=10) == []


def test_popen_streams_both_ways(sb):
    proc = sb.Popen(["sh", "-c", "while read line; do echo got:$line; done"], stdin=quinebox.PIPE, stdout=quinebox.PIPE)
    proc.stdin.write(b"one\n")
    assert proc.stdout.readline() == b"got:one\n"
    proc.stdin.write(b"two\n")
    assert proc.stdout.readline() == b"got:two\n"
    proc.stdin.close()
    assert proc.wait(10) == 0 and proc.stdout.read() == b""


def test_kill_ends_a_popen_tree(sb):
    proc = sb.Popen(["sh", "-c", "sleep 300 & sleep 300"], stdin=quinebox.DEVNULL)
    time.sleep(0.3)
    proc.kill()
    assert proc.wait(10) == 137


def test_files_round_trip_exact_bytes(sb):
    data = bytes(range(256)) * 1000
    sb.write_file("/world/deep/er/data.bin", data)
    assert sb.read_file("/world/deep/er/data.bin") == data
    sb.write_file("notes.txt", "relative to the box's cwd ✓")  # /world
    assert sb.exec(["cat", "/world/notes.txt"]).stdout == "relative to the box's cwd ✓".encode()


def test_file_errors_are_pythons_own(sb):
    with pytest.raises(FileNotFoundError):
        sb.read_file("/world/no/such/file")
    with pytest.raises(IsADirectoryError):
        sb.read_file("/world")
    with pytest.raises(IsADirectoryError):
        sb.write_file("/world", b"x")
    if BOX_UID != 0:  # a rootless box's user owns its copy of the image, /etc/shadow too
        with pytest.raises(PermissionError):
            sb.read_file("/etc/shadow")
    with pytest.raises(PermissionError):  # the box's root is read-only
        sb.write_file("/etc/evil", b"x")
    sb.exec(["sh", "-c", "echo kept > /world/locked && chmod 444 /world/locked"])
    with pytest.raises(PermissionError):  # a file its user may not write stays as it was, though its directory is writable
        sb.write_file("/world/locked", b"replaced")
    assert sb.read_file("/world/locked") == b"kept\n"


def test_world_revisions_follow_the_execs(sb):
    sb.exec(["sh", "-c", "echo first > /world/rev.txt"])
    log = sb.world.log()
    assert log[-1]["command"] == "sh -c 'echo first > /world/rev.txt'" and log[-1]["files"] == 1
    assert "+first" in sb.world.diff()
    out = io.BytesIO()
    sb.world.export(out)
    with tarfile.open(fileobj=io.BytesIO(out.getvalue())) as tar:
        assert tar.extractfile("rev.txt").read() == b"first\n"
    assert sb.world.commit() is None  # nothing changed since


def test_grants_are_the_boxs_own(tmp_path):
    (tmp_path / "host.txt").write_text("from the host")
    tmp_path.chmod(0o755)  # pytest makes it the host user's alone; the box's user reads it as any other would
    with quinebox.Sandbox(grants=[f"ro:{tmp_path}=/data"]) as box:
        assert box.exec(["cat", "/data/host.txt"]).stdout == b"from the host"
        assert box.exec(["sh", "-c", "echo x > /data/new"]).returncode != 0
        network = box.exec(["python3", "-c", "import socket; socket.create_connection(('1.1.1.1', 53), timeout=2)"])
        assert network.returncode != 0
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("backend", BACKENDS)
def test_close_leaves_nothing(backend, engine):
    box = quinebox.Sandbox(backend=backend)
    box.exec(["sh", "-c", "sleep 300 </dev/null >/dev/null 2>&1 &"])
    session = box.id
    box.close()
    box.close()  # a second close does nothing
    assert soon(lambda: [b for b in live_boxes(engine) if b.labels.get("io.quinebox.session") == session]) == []
    assert soon(lambda: cgroups_of(session)) == []
    assert not (sandboxes.records_dir() / f"{session}.json").exists()
    with pytest.raises(QuineboxError, match="not running"):
        box.exec(["true"])


def test_ttl_ends_the_box():
    box = quinebox.Sandbox(ttl=1)
    assert box.wait(10) == 124
    with pytest.raises(QuineboxError, match="not running"):
        box.exec(["true"])


def test_a_bad_grant_starts_nothing(engine):
    before = {box.id for box in live_boxes(engine)}
    with pytest.raises(GrantError):
        quinebox.Sandbox(grants=["rw:/etc"])
    # No new box; one an earlier test left going away meanwhile is no failure of this one (compared by count, it was).
    assert {box.id for box in live_boxes(engine)} - before == set()


def test_the_box_goes_with_its_owner(engine):
    owner = subprocess.Popen(
        [sys.executable, "-c", "import quinebox, sys, time\nsb = quinebox.Sandbox()\nprint(sb.id, flush=True)\ntime.sleep(300)"],
        stdout=subprocess.PIPE,
    )
    session = owner.stdout.readline().decode().strip()
    assert [b for b in live_boxes(engine) if b.labels.get("io.quinebox.session") == session]
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    assert soon(lambda: [b for b in live_boxes(engine) if b.labels.get("io.quinebox.session") == session], within=10) == []
    assert soon(lambda: cgroups_of(session), within=10) == []
    assert session not in [record.session for record in sandboxes.records()]


def test_async_twins_run_concurrently():
    async def main():
        async with await quinebox.Sandbox.acreate() as box:
            await box.awrite_file("/world/a", b"A")
            results = await asyncio.gather(*(box.aexec(["sh", "-c", f"sleep 0.5; echo {i}"]) for i in range(4)))
            return [r.stdout for r in results], await box.aread_file("/world/a")

    began = time.monotonic()
    outputs, data = asyncio.run(main())
    assert outputs == [b"0\n", b"1\n", b"2\n", b"3\n"] and data == b"A"
    assert time.monotonic() - began < 10


@pytest.mark.root_only  # gVisor is refused to a user who is not root here
def test_gvisor_execs_keep_the_channels_and_timeouts():
    with quinebox.Sandbox(runtime="runsc") as box:
        result = box.exec(["sh", "-c", "cat; echo err >&2; exit 3"], input=b"in")
        assert (result.returncode, result.stdout, result.stderr) == (3, b"in", b"err\n")
        box.write_file("/world/g.txt", b"gvisor")
        assert box.read_file("/world/g.txt") == b"gvisor"
        assert box.exec(["sh", "-c", "sleep 300 & sleep 300"], timeout=1).returncode == 124
        assert b"sleep" not in box.exec(["sh", "-c", "cat /proc/[0-9]*/comm"]).stdout


# -- the pytest plugin's fixtures (quinebox/integrations/pytest_plugin.py), used here as any project would ----------


def test_a_fixture_box_starts_with_an_empty_world(quinebox_sandbox):
    assert quinebox_sandbox.exec(["ls", "-A", "/world"]).stdout == b""
    quinebox_sandbox.write_file("/world/mine", b"only this test's")


@pytest.mark.quinebox(grants=["mem:64m"])
def test_a_marked_fixture_box_holds_the_marks_grants(quinebox_sandbox):
    hog = quinebox_sandbox.exec(["python3", "-c", "b = bytearray(256 << 20); print(len(b))"], timeout=30)
    assert hog.returncode == 137 and hog.stdout == b""
    assert quinebox_sandbox.exec(["echo", "still up"]).stdout == b"still up\n"


# -- what a box plants where the host reads and writes its files -------------------------------------------------

#: Made by the box as its own user: a FIFO nobody writes, a socket, devices behind links, a file past a small cap, and
#: a file that grows for as long as the box likes.
PLANT = (
    "mkfifo /tmp/fifo && ln -s /tmp/fifo /world/to-fifo && ln -s /dev/zero /tmp/zero && ln -s /dev/null /tmp/null && "
    "head -c 5000 /dev/zero > /tmp/big && "
    "(while :; do head -c 65536 /dev/zero; sleep 0.01; done > /tmp/grow 2>/dev/null & echo $! > /tmp/grow.pid) && "
    + " ".join(GUEST_PYTHON) + " -c \"import socket; s=socket.socket(socket.AF_UNIX); s.bind('/tmp/sock')\""
)
#: Each planted path, and what reading it says (its error and words of its message).
PLANTED_READS = [
    ("/tmp/fifo", shutil.SpecialFileError, "a FIFO, not a regular file"),
    ("/world/to-fifo", shutil.SpecialFileError, "a FIFO, not a regular file"),
    ("/tmp/sock", shutil.SpecialFileError, "a socket, not a regular file"),
    ("/tmp/zero", shutil.SpecialFileError, "a character device, not a regular file"),
    ("/tmp/null", shutil.SpecialFileError, "a character device, not a regular file"),
    ("/dev/zero", shutil.SpecialFileError, "a character device"),
    ("/tmp/big", quinebox.FileTooLargeError, "holds 5000 bytes, more than the cap of 4096: give read_file(..., max_bytes=N)"),
    ("/tmp/grow", quinebox.FileTooLargeError, "more than the cap of 4096"),
]


@pytest.fixture(scope="module")
def planted(sb):
    assert sb.exec(["sh", "-c", PLANT]).returncode == 0
    yield sb
    sb.exec(["sh", "-c", "kill $(cat /tmp/grow.pid); rm -f /tmp/grow"])


@pytest.mark.parametrize("path, error, words", PLANTED_READS, ids=[p for p, *_ in PLANTED_READS])
def test_a_planted_file_is_refused_at_once_and_the_box_stays_up(planted, path, error, words):
    began = time.monotonic()
    with pytest.raises(error, match=re.escape(words)) as raised:
        planted.read_file(path, max_bytes=4096)
    took = time.monotonic() - began
    print(f"\nplanted read_file {planted.target.backend} {path}: {took:.3f} s: {raised.value}")
    assert took < 5 and "\n" not in str(raised.value)
    assert isinstance(raised.value, OSError)  # one `except OSError` covers every way a read fails
    assert planted.exec(["echo", "up"]).stdout == b"up\n"


@pytest.mark.parametrize("path, words", [("/tmp/fifo", "a FIFO"), ("/world/to-fifo", "a FIFO"), ("/tmp/sock", "a socket"), ("/tmp/zero", "a character device")])
def test_write_file_onto_a_planted_fifo_socket_or_device_is_refused(planted, path, words):
    began = time.monotonic()
    with pytest.raises(shutil.SpecialFileError, match=words):
        planted.write_file(path, b"data")
    took = time.monotonic() - began
    print(f"\nplanted write_file {planted.target.backend} {path}: {took:.3f} s")
    assert took < 5
    assert planted.exec(["sh", "-c", f"test -L {path} || test -p {path} || test -S {path}"]).returncode == 0  # left as it was


def test_a_file_within_the_cap_is_read_whole_and_the_cap_can_be_raised(planted):
    assert planted.read_file("/tmp/big", max_bytes=5000) == b"\0" * 5000
    assert len(planted.read_file("/tmp/big")) == 5000  # the default cap is 256 MiB


def test_a_reader_the_box_stops_meets_its_deadline(sb):
    """The box's own processes run as its user, as files.py does: one may stop the reader. The host's deadline ends it."""
    sb.exec(["sh", "-c", "echo slow > /tmp/slow"])
    stop = ("import os, signal\nwhile True:\n for p in os.listdir('/proc'):\n  try:\n"
            "   if p.isdigit() and int(p) != os.getpid() and b'files.py' in open(f'/proc/{p}/cmdline', 'rb').read(): os.kill(int(p), signal.SIGSTOP)\n"
            "  except OSError: pass\n")
    stopper = sb.Popen([*GUEST_PYTHON, "-c", stop], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    try:
        began = time.monotonic()
        with pytest.raises(TimeoutError, match="took longer than 2 s"):
            sb.read_file("/tmp/slow", timeout=2)
        took = time.monotonic() - began
        print(f"\nstopped reader {sb.target.backend}: {took:.3f} s")
        assert took < 15
    finally:
        stopper.kill()
        stopper.wait(10)
    assert sb.read_file("/tmp/slow") == b"slow\n"


def test_a_world_holding_what_the_box_planted_is_revised_exported_and_shown_at_once(sb):
    """The host reads a world itself (revisions, export, the view): a FIFO, a socket, a link to a device and a file
    still growing are recorded as what they are, and no read waits or runs on."""
    from quinebox.view import worlds_view

    plant = ("mkdir -p /world/planted && cd /world/planted && mkfifo fifo && ln -s /dev/zero zero && "
             "(while :; do head -c 65536 /dev/zero; sleep 0.02; done > grow 2>/dev/null & echo $! > /tmp/wgrow.pid) && sleep 0.3 && "
             + " ".join(GUEST_PYTHON) + " -c \"import socket; socket.socket(socket.AF_UNIX).bind('sock')\"")
    began = time.monotonic()
    assert sb.exec(["sh", "-c", plant]).returncode == 0  # and its revision, made by the host as the exec ended
    try:
        revised = time.monotonic() - began
        rev = sb.world.log()[-1]["rev"]
        began = time.monotonic()
        out = io.BytesIO()
        sb.world.export(out)
        exported = time.monotonic() - began
        with tarfile.open(fileobj=io.BytesIO(out.getvalue())) as tar:
            members = {m.name: m for m in tar.getmembers()}
            grow = tar.extractfile("planted/grow").read()
        assert members["planted/fifo"].isfifo() and members["planted/zero"].issym() and "planted/sock" not in members
        assert len(grow) == members["planted/grow"].size and set(grow) <= {0}
        began = time.monotonic()
        shown = {name: worlds_view.file(sb.id, rev, f"planted/{name}") for name in ("fifo", "zero", "sock", "grow")}
        viewed = time.monotonic() - began
        assert (shown["fifo"]["type"], shown["sock"]["type"], shown["zero"]["text"]) == ("p", "s", "-> /dev/zero")
        assert shown["grow"]["size"] == len(grow)
        print(f"\nplanted world {sb.target.backend}: exec and revision {revised:.3f} s, export {exported:.3f} s, view {viewed:.3f} s")
        assert max(revised, exported, viewed) < 5
    finally:
        sb.exec(["sh", "-c", "kill $(cat /tmp/wgrow.pid); rm -rf /world/planted"])
    assert sb.exec(["echo", "up"]).stdout == b"up\n"

"""The bubblewrap backend on the real bwrap, kernel and cgroups (backends/bwrap/): what a user of `--backend bwrap`
depends on, as root and (CI's rootless pass, QUINEBOX_TEST_ROOTLESS=1) as a plain user.

Exact bytes on every channel and the exit status, the caller's own pipe held by the box, an OOM kill as 137 and its
line, the pids limit refused by the kernel, the box's own cgroup in every hierarchy from its first instruction, never
host root (read from the host's /proc for every process of the box, bwrap's own included), no byte written into the
image cache, a terminal (its size, ^C), the world, and an agent's run.
"""

from __future__ import annotations

import json
import os
import pty
import resource
import select
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from commands import QUINEBOX, ROOTLESS, scripts, wait_for
from live_boxes import cgroups_of
from openai_server import exit_, sh

import quinebox
from quinebox.agent.store import read_tape
from quinebox.box.backends.bwrap import box as bwrap_start
from quinebox.box.backends.bwrap.box import REMOVE_WITHIN, BwrapProcess
from quinebox.box.backends.bwrap.configure import configure_bwrap
from quinebox.box.backends.oci.idmap import BASE, BOXES, SLOTS, SPAN
from quinebox.box.configure import unpacked_image
from quinebox.box.spec import DEFAULT_IMAGE, build_spec
from quinebox.errors import EngineError, ErrorKind
from quinebox.processes import pid_alive
from quinebox.state import session_dir, state_dir

#: The hierarchies a box's cgroup is made in (cgroups.py); a plain user's unified one is systemd's, not delegated on v1.
HIERARCHIES = ("memory", "pids", "cpu", "freezer")


@pytest.fixture
def bwrap(monkeypatch, engine):
    """Boxes on bwrap; the engine (none in the rootless pass) unpacks the agent image the first time only."""
    monkeypatch.setenv("QUINEBOX_BACKEND", "bwrap")
    monkeypatch.delenv("QUINEBOX_RUNTIME", raising=False)
    done = quinebox.exec(["true"])
    assert done.returncode == 0, done.stderr


@pytest.fixture(params=["quinebox-boxstart", "util-linux"])
def starter(request, monkeypatch):
    """Each box started under quinebox-boxstart (bin/boxstart.c, which scripts/setup.sh builds beside the interpreter)
    and under util-linux's prlimit and setpriv, which start it where that is not: the box must be the same."""
    if request.param == "util-linux":
        monkeypatch.setattr(bwrap_start, "boxstart", lambda: None)
    else:
        built_boxstart()
    return request.param


def built_boxstart() -> str:
    """quinebox-boxstart beside this interpreter, which setup (and CI's) builds: its absence fails the test."""
    path = bwrap_start.boxstart()
    if path is None:
        pytest.fail(f"{bwrap_start.BOXSTART} is not beside {sys.executable}: scripts/setup.sh builds it (bin/boxstart.c)")
    return path


def cli(*argv: str, input: bytes = b"", timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([QUINEBOX, "exec", "--backend", "bwrap", *argv], input=input, capture_output=True, timeout=timeout)


def records() -> list[Path]:
    directory = state_dir() / "bwrap"
    return sorted(directory.glob("*.json")) if directory.is_dir() else []


def test_the_channels_are_byte_exact_and_the_status_passes(bwrap):
    data = os.urandom(1 << 20) + b"\0\r\n\xff"
    result = quinebox.exec(["sh", "-c", "cat; printf 'to stderr' >&2; exit 7"], input=data)
    assert (result.returncode, result.stdout, result.stderr) == (7, data, b"to stderr")
    said = cli("--", "sh", "-c", "read line; echo \"got $line\"; echo oops >&2; kill -TERM $$", input=b"hello\n")
    assert (said.returncode, said.stdout, said.stderr) == (143, b"got hello\n", b"oops\n")
    assert records() == []  # its remains went with it


#: Commands whose every byte and status a one-shot box's native init (images/init.c) gives as init.py gives them:
#: its status, a command not found (127) or not runnable (126) and its line, a signal's death (128+N), an orphan
#: reaped by the box's PID 1 (no zombie left a second after it ended).
PARITY = {
    "status and channels": ["sh", "-c", "echo out; echo err >&2; exit 7"],
    "not found": ["no-such-command", "arg"],
    "not runnable": ["/tmp"],
    "a signal's death": ["sh", "-c", "kill -TERM $$"],
    "SIGKILL": ["sh", "-c", "kill -KILL $$"],
    "an orphan reaped": ["sh", "-c", "(sleep 0.2 &); sleep 1.2; cut -d' ' -f3 /proc/[0-9]*/stat | grep -c Z"],
}


@pytest.mark.parametrize("backend", ["bwrap", "oci"])
@pytest.mark.parametrize("name", PARITY)
def test_the_native_init_answers_as_init_py_does(bwrap, name, backend):
    """The same command in a one-shot box on bwrap or runc (the native init) and in one that reaches the network
    through the host (init.py, for its egress forwarder): the same bytes and status."""
    native = quinebox.exec(PARITY[name], backend=backend)
    python = quinebox.exec(PARITY[name], backend=backend, grants=["net:example.com:443"])
    assert (native.returncode, native.stdout, native.stderr) == (python.returncode, python.stdout, python.stderr)


@pytest.mark.parametrize("backend", ["bwrap", "oci"])
def test_a_one_shot_box_runs_the_native_init_which_passes_signals_on(bwrap, backend):
    """Its PID 1 is the guest runtime's native init, which passes the host's SIGTERM on to the command."""
    proc = quinebox.Popen(["sh", "-c", "trap 'echo caught; exit 3' TERM; tr '\\0' ' ' < /proc/1/cmdline; echo; sleep 30 & wait"], stdout=quinebox.PIPE,
                          backend=backend)
    try:
        assert proc.stdout.readline().split()[:2] == [b"/.quinebox/bin/init", b"--"]
        proc.send_signal(signal.SIGTERM)
        assert (proc.wait(10), proc.stdout.read()) == (3, b"caught\n")
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("backend", ["bwrap", "oci"])
def test_a_box_that_needs_init_py_runs_it(bwrap, backend):
    """A lasting box starts execs beside its command, which only init.py does: its PID 1 is init.py's."""
    with quinebox.Sandbox(backend=backend) as box:
        shown = box.exec(["cat", "/proc/1/cmdline"]).stdout.split(b"\0")
    assert b"/.quinebox/guest/lifeline.py" in shown


def test_an_argument_that_looks_like_an_option_is_the_boxs_own(bwrap, tmp_path, monkeypatch):
    """bwrap's command line is read as bwrap reads it: an environment variable's value `--ro-bind` is a value."""
    monkeypatch.chdir(tmp_path)  # a directory the box's host ids may not walk to: a path taken for a source would be bound
    result = quinebox.exec(["sh", "-c", 'printf %s "$V"'], grants=["env:V=--ro-bind"])
    assert (result.returncode, result.stdout) == (0, b"--ro-bind"), result.stderr


def test_a_box_bwrap_cannot_make_is_one_error_and_leaves_nothing(bwrap, tmp_path):
    """bwrap failing to make the box (here a bind source gone between configure and start) is quinebox's failure, an
    EngineError (exit 125 at the CLI), never the box's exit status; its cgroups, record and ids go with it."""
    os.chmod(tmp_path, 0o755)
    spec, _, config = configure_bwrap(replace(build_spec(["true"], world=str(tmp_path)), lifeline=None))  # no broker: no socket to bind
    argv = list(config.box.argv)
    at = argv.index("--chdir")
    argv[at:at] = ["--ro-bind", f"/{spec.session}-gone", "/gone"]  # a path any id may walk to: bwrap's to find missing
    ended: list[tuple] = []
    read_end, write_end = os.pipe()
    try:
        with pytest.raises(EngineError, match=r"bwrap could not make the box \(it exited 1\): its own line above says why"):
            BwrapProcess(spec.session, replace(config.box, argv=argv), labels=config.labels, image_root=config.image_root, cgroup_path=config.cgroup,
                         ids=config.ids, stdio=(0, write_end, write_end), ended=lambda *a: ended.append(a))
    finally:
        os.close(write_end)
        said = os.read(read_end, 4096)
        os.close(read_end)
    assert said.startswith(b"bwrap: Can't find source path") and ended == [], said
    assert (cgroups_of(spec.session), records()) == ([], [])
    assert config.ids is None or not config.ids.dir.exists() or f"claim.{spec.session}" not in os.listdir(config.ids.dir)


def test_the_box_holds_the_callers_own_pipe(bwrap):
    """No relay: the box's stdout is the very pipe the caller gave it (same inode)."""
    read_end, write_end = os.pipe()
    proc = quinebox.Popen(["readlink", "/proc/self/fd/1"], stdin=quinebox.DEVNULL, stdout=write_end)
    os.close(write_end)
    shown = os.read(read_end, 200)
    assert proc.wait() == 0
    assert shown.strip() == f"pipe:[{os.fstat(read_end).st_ino}]".encode()
    os.close(read_end)


def test_a_holder_with_more_than_1024_fds_starts_a_box(bwrap):
    """A process holding many boxes (an agent's hundred children, each with its pipes, pidfd and sockets) has fds past
    select(2)'s 1024: bwrap's start waits on them with poll(2). Before, each such start failed (ValueError from select)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"this process may hold only {hard} fds")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200) if soft != resource.RLIM_INFINITY else soft, hard))
    null = os.open(os.devnull, os.O_RDONLY)
    held = [os.dup(null) for _ in range(1100)]
    try:
        done = quinebox.exec(["sh", "-c", "echo started"])
        assert (done.returncode, done.stdout) == (0, b"started\n"), done.stderr
    finally:
        for fd in (null, *held):
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_box_outlives_the_thread_that_started_it(bwrap):
    """--die-with-parent is the kernel's parent-death signal, sent when the *thread* that forked bwrap ends: a box
    started from a caller's short-lived thread runs on, and no thread of quinebox's is left once it has ended."""
    started: list = []
    starter = threading.Thread(target=lambda: started.append(quinebox.Popen(["sh", "-c", "read go; echo lived"], stdin=quinebox.PIPE, stdout=quinebox.PIPE)))
    starter.start()
    starter.join()
    [proc] = started
    proc.stdin.write(b"go\n")
    proc.stdin.close()
    assert (proc.stdout.read(), proc.wait()) == (b"lived\n", 0)
    until = time.monotonic() + 10
    while any(t.name == "bwrap-starter" for t in threading.enumerate()) and time.monotonic() < until:
        time.sleep(0.01)
    assert [t.name for t in threading.enumerate() if t.name == "bwrap-starter"] == []


def test_a_box_started_from_the_main_thread_takes_no_thread_to_start(bwrap):
    """The main thread ends only with the process (which --die-with-parent follows), so it starts its bwraps itself:
    no starter thread is made (a served exec's worker pays for none), and the box runs and ends as ever."""
    proc = quinebox.Popen(["sh", "-c", "read go; echo lived"], stdin=quinebox.PIPE, stdout=quinebox.PIPE)
    try:
        assert [t.name for t in threading.enumerate() if t.name == "bwrap-starter"] == []
    finally:
        proc.stdin.write(b"go\n")
        proc.stdin.close()
        assert (proc.stdout.read(), proc.wait()) == (b"lived\n", 0)


def test_an_oom_kill_is_137_and_its_line(bwrap):
    hog = quinebox.exec(["python3", "-c", "b = bytearray(256 << 20)"], grants=["mem:64m"])
    assert (hog.returncode, hog.oom_killed) == (137, True)
    said = cli("-g", "mem:64m", "--", "python3", "-c", "b = bytearray(256 << 20)")
    assert said.returncode == 137
    assert said.stderr.endswith(b"quinebox: out of memory: the box hit its memory limit (mem:64m) and the kernel killed a process in it\n"), said.stderr


def test_the_kernel_refuses_a_process_past_the_pids_limit(bwrap):
    script = (
        "import os, errno\nborn = 0\n"
        "try:\n    for _ in range(40):\n        if os.fork() == 0:\n            os.pause()\n        born += 1\n"
        "except OSError as e:\n    print(born, errno.errorcode[e.errno])\n"
    )
    result = quinebox.exec(["python3", "-c", script], grants=["pids:12"])
    born, error = result.stdout.split()
    assert error == b"EAGAIN" and 0 < int(born) < 12, result.stdout + result.stderr


def test_the_box_is_in_its_own_cgroup_from_its_first_instruction(bwrap, starter):
    """The box's PID 1 and its command, read from inside as they start: every hierarchy holding its limits names the
    box's own cgroup (bwrap's child waited on its block fd until it was placed); the limits are there on the host."""
    proc = quinebox.Popen(["sh", "-c", "cat /proc/1/cgroup /proc/self/cgroup; exec sleep 30"], stdout=quinebox.PIPE, grants=["pids:77", "mem:99m"])
    try:
        lines = [proc.stdout.readline().decode() for _ in range(2 * len(Path("/proc/self/cgroup").read_text().splitlines()))]
        for name in HIERARCHIES:
            placed = [line for line in lines if line.split(":")[1].split(",").count(name)]
            assert len(placed) == 2 and all(line.rstrip().endswith(f"/quinebox-{proc.session}") for line in placed), (name, lines)
        pids = next(g for g in cgroups_of(proc.session) if "/pids/" in g)
        memory = next(g for g in cgroups_of(proc.session) if "/memory/" in g)
        assert Path(pids, "pids.max").read_text() == "77\n" and Path(memory, "memory.limit_in_bytes").read_text() == f"{99 << 20}\n"
    finally:
        proc.kill()
        proc.wait()
    # Its remains go right after its end is told, on its waiting thread (box.py): its caller does not wait for them.
    wait_for(lambda: not cgroups_of(proc.session), timeout=REMOVE_WITHIN, every=0.005, what="the box's cgroups to go")


def _limits(text: str) -> dict[str, tuple[str, str]]:
    """/proc/PID/limits' core and open-files rows: (soft, hard)."""
    rows = {line[:26].strip(): line[26:].split()[:2] for line in text.splitlines()[1:]}
    return {"core": tuple(rows["Max core file size"]), "nofile": tuple(rows["Max open files"])}  # type: ignore[dict-item]


def test_the_box_holds_its_rlimits_from_its_first_instruction(bwrap, starter):
    """core 0:0 and nofile 1024:8192 (policy.RLIMITS), as runc's boxes have them: on the box's PID 1 and a process it
    forks, read from inside as they start (the starter set them on itself before it became bwrap), and on bwrap itself,
    read from the host."""
    proc = quinebox.Popen(["sh", "-c", "cat /proc/1/limits; echo --; cat /proc/self/limits; exec sleep 30"], stdout=quinebox.PIPE)
    try:
        inside = b""
        while inside.count(b"Max realtime timeout") < 2:
            inside += proc.stdout.read1(65536)
        first, forked = inside.decode().split("--\n")
        bwrap = int(Path(f"/proc/{proc.pid}/stat").read_text().rpartition(")")[2].split()[1])  # the box's PID 1's parent
        assert Path(f"/proc/{bwrap}/comm").read_text() == "bwrap\n"
        for text in (first, forked, Path(f"/proc/{bwrap}/limits").read_text()):
            assert _limits(text) == {"core": ("0", "0"), "nofile": ("1024", "8192")}, text
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize(("options", "said"), [
    (["--rlimit=nofile=1024:2000000000"], "nofile=1024:2000000000: Operation not permitted"),  # over fs.nr_open: refused even with CAP_SYS_RESOURCE
    (["--rlimit=nofile=8192:1024"], "not NAME=SOFT:HARD with SOFT <= HARD: nofile=8192:1024"),
    (["--rlimit=nofile=1024"], "not NAME=SOFT:HARD: nofile=1024"),
    (["--rlimit=files=1:1"], "no such rlimit: files=1:1"),
    (["--rlimit=core=-1:0"], "not NAME=SOFT:HARD with SOFT <= HARD: core=-1:0"),
    (["--rlimit=core=0:99999999999999999999999"], "not NAME=SOFT:HARD with SOFT <= HARD: core=0:99999999999999999999999"),
    (["--ids=1000"], "not --ids=UID:GID: 1000"),
    (["--ids=1000:-1"], "not --ids=UID:GID: 1000:-1"),
    (["--ids=4294967295:0"], "not --ids=UID:GID: 4294967295:0"),  # (uid_t)-1: "leave it as it is" to the kernel
    (["--setuid=0"], "an option quinebox-boxstart does not know: --setuid=0"),
    ([], "no program after --"),
])
def test_the_starter_refuses_what_it_cannot_do_in_one_line_and_runs_nothing(tmp_path, options, said):
    """quinebox-boxstart, which starts each box before bwrap, says what it cannot do in one line and exits 125 (box.py
    then says bwrap did not start the box), before it runs anything."""
    marker = tmp_path / "ran"
    program = [] if said == "no program after --" else ["/bin/touch", str(marker)]
    done = subprocess.run([built_boxstart(), *options, "--", *program], capture_output=True, timeout=30)
    assert (done.returncode, done.stdout, done.stderr.decode()) == (125, b"", f"quinebox: cannot start the box: {said}\n")
    assert not marker.exists()


def test_no_process_of_the_box_is_ever_host_root_and_the_host_holds_none_of_its_mounts(bwrap, starter):
    """From the host's /proc: bwrap and every process of the box run as the box's own unprivileged host ids (root) or
    the caller (a plain user), in every id the kernel keeps, and hold no capability."""
    proc = quinebox.Popen(["sh", "-c", "sleep 30 & sleep 30 & echo up; wait"], stdout=quinebox.PIPE)
    try:
        assert proc.stdout.readline() == b"up\n"
        # What bwrap was given to bind (the image's tree, the world, the lifeline's socket) is the box's own mounts now:
        # the host holds none of them while it runs.
        assert [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if proc.session in line] == []
        [procs] = [g for g in cgroups_of(proc.session) if "/pids/" in g]
        pids = [int(p) for p in Path(procs, "cgroup.procs").read_text().split()]
        assert proc.pid in pids and len(pids) >= 4  # the box's init (its PID 1), sh and two sleeps
        bwrap = int(Path(f"/proc/{proc.pid}/stat").read_text().rpartition(")")[2].split()[1])  # outside the box's cgroup, as `runc run` is
        assert bwrap not in pids and Path(f"/proc/{bwrap}/comm").read_text() == "bwrap\n"
        for pid in [bwrap, *pids]:
            status = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":\t" in line)
            uids, gids = status["Uid"].split(), status["Gid"].split()
            assert status["CapEff"] == status["CapPrm"] == "0000000000000000", (pid, status["Name"])
            if ROOTLESS:
                assert uids == [str(os.getuid())] * 4 and gids == [str(os.getgid())] * 4, (pid, status["Name"], uids)
            else:
                assert len(set(uids)) == len(set(gids)) == 1 and BASE <= int(uids[0]) < BASE + SLOTS * SPAN, (pid, status["Name"], uids, gids)
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.skipif(ROOTLESS, reason="as root: bwrap becomes the box's own host ids, with none of its caller's groups")
def test_a_root_made_box_holds_none_of_its_callers_groups(bwrap, starter):
    """A caller's supplementary group is not the box's (one the box's namespace has no name for would show as 65534)."""
    done = subprocess.run([QUINEBOX, "exec", "--backend", "bwrap", "--", "grep", "^Groups", "/proc/self/status"], capture_output=True, timeout=60, extra_groups=[4242])
    assert done.returncode == 0 and done.stdout.split() == [b"Groups:"], done


def _dirs(root: str) -> dict[str, tuple[int, int, int]]:
    """Every directory of a tree with its mtime, ctime and link count: a mount point made in it changes them."""
    found = {}
    for path, _, _ in os.walk(root):
        st = os.lstat(path)
        found[path] = (st.st_mtime_ns, st.st_ctime_ns, st.st_nlink)
    return found


def test_nothing_of_a_box_is_written_into_the_image_cache(bwrap, tmp_path):
    """Mount points the image lacks (a grant deep under a directory it has, a file's, /world) are made on tmpfs, never in
    the shared image tree; the box's root stays read-only."""
    _, image_root = unpacked_image(DEFAULT_IMAGE, pull="never")
    (tmp_path / "notes.txt").write_text("notes\n")
    (tmp_path / "tool").mkdir()
    os.chmod(tmp_path, 0o755)
    before = _dirs(image_root)
    result = quinebox.exec(
        ["sh", "-c", "cat /notes.txt; ls -d /opt/newdir/deep; touch /etc/x 2>/dev/null || echo read-only"],
        grants=[f"ro:{tmp_path}/notes.txt=/notes.txt", f"ro:{tmp_path}/tool=/opt/newdir/deep"], world_from=["empty"],
    )
    assert (result.returncode, result.stdout) == (0, b"notes\n/opt/newdir/deep\nread-only\n"), result.stderr
    assert _dirs(image_root) == before
    assert not os.path.exists(os.path.join(image_root, "notes.txt")) and not os.path.exists(os.path.join(image_root, "opt/newdir"))


def test_the_world_is_the_boxs_users_on_the_host(bwrap, tmp_path):
    world = tmp_path / "w"
    world.mkdir()
    (world / "in").write_bytes(b"from the host\n")
    os.chmod(world, 0o777)
    result = quinebox.exec(["sh", "-c", "cat /world/in; echo made > /world/out; pwd"], world=str(world))
    assert (result.returncode, result.stdout) == (0, b"from the host\n/world\n"), result.stderr
    made = (world / "out").stat()
    assert (world / "out").read_bytes() == b"made\n"
    if ROOTLESS:
        assert (made.st_uid, made.st_gid) == (os.getuid(), os.getgid())
    else:
        assert BASE <= made.st_uid < BASE + SLOTS * SPAN and made.st_uid == made.st_gid  # the box's own host id, never root's


def test_a_chown_to_an_id_not_the_boxs_own_is_eperm_as_on_runc(bwrap):
    """bwrap maps only the box's own uid and gid: the kernel said EINVAL of any other id, where runc's box (65536 ids
    mapped) is refused EPERM; tools that keep a file's owner tolerate EPERM alone (GNU patch failed the pipeline
    example's patch over "Failed to set the owning group ... Invalid argument"). The box's own ids and -1 pass."""
    script = (
        "import errno, os\n"
        "open('f', 'w').close()\n"
        "said = []\n"
        "for ids in ((-1, 0), (0, -1), (-1, 65534), (65534, -1), (os.getuid(), os.getgid()), (-1, -1), (-1, os.getgid())):\n"
        "    try:\n"
        "        os.chown('f', *ids); said.append('ok')\n"
        "    except OSError as e:\n"
        "        said.append(errno.errorcode[e.errno])\n"
        "fd = os.open('f', os.O_RDONLY)\n"
        "for call in (lambda: os.fchown(fd, -1, 0), lambda: os.chown('f', -1, 0, follow_symlinks=False), lambda: os.fchown(fd, -1, os.getgid())):\n"
        "    try:\n"
        "        call(); said.append('ok')\n"
        "    except OSError as e:\n"
        "        said.append(errno.errorcode[e.errno])\n"
        "print(' '.join(said))\n"
    )
    result = quinebox.exec(["sh", "-c", 'cd /tmp && exec python3 -c "$0"', script])
    assert (result.returncode, result.stdout) == (0, b"EPERM EPERM EPERM EPERM ok ok ok EPERM EPERM ok\n"), result.stderr


def test_a_working_directory_the_box_cannot_enter_is_125_and_one_line_and_leaves_nothing(bwrap, tmp_path):
    """bwrap's own `--chdir` failing ran after the box was released: its exit 1 and its own line were the box's
    status, as if the command had failed. Now it is refused before anything of the box runs, as runc refuses it."""
    inner = tmp_path / "closed" / "inner"  # below a directory the box's user may not search (configure looks at the last one only)
    inner.mkdir(parents=True)
    inner.parent.chmod(0o000)  # none for the box's user, root-made (other ids) or a plain user's (their own)
    os.chmod(tmp_path, 0o755)
    for workdir, why in (("/etc/passwd", b"not a directory"), (str(inner), b"permission denied")):
        said = cli("-g", f"ro:{tmp_path}", "--workdir", workdir, "--", "sh", "-c", "echo ran")
        assert (said.returncode, said.stdout, said.stderr.count(b"\n")) == (125, b"", 1), said.stderr
        assert said.stderr.startswith(b"quinebox: ") and workdir.encode() in said.stderr and why in said.stderr, said.stderr
    assert records() == []
    ran = cli("--workdir", "/bin", "--", "pwd", "-P")  # a link in the image's root (to usr/bin): walked in the box's root
    assert (ran.returncode, ran.stdout) == (0, b"/usr/bin\n"), ran.stderr


def test_its_own_world_shut_by_its_last_box_is_refused_in_one_line_and_leaves_nothing(bwrap):
    """A box's own world is entered without the walk to it as the box's user (its user owns it), but one its last box
    shut (`chmod 000 /world`, then resumed) is looked at on the host and refused as any working directory its user
    cannot enter: quinebox's one line, before anything of the box runs, never bwrap's `--chdir` failing as its status."""
    spec, _, config = configure_bwrap(replace(build_spec(["true"]), lifeline=None))  # no broker: no socket to bind
    assert config.box.workdir_ours and spec.world is not None and spec.world.kind == "dir"
    layer = Path(spec.world.layer)
    layer.mkdir(parents=True)
    os.chown(layer, *config.box.host_ids)
    layer.chmod(0o000)
    ended: list[tuple] = []
    try:
        with pytest.raises(EngineError, match=r"its user cannot enter its working directory /world: permission denied") as refused:
            BwrapProcess(spec.session, config.box, labels=config.labels, image_root=config.image_root, cgroup_path=config.cgroup,
                         ids=config.ids, stdio=(0, 1, 2), ended=lambda *a: ended.append(a))
        assert refused.value.kind is ErrorKind.BAD_INPUT and ended == []
        assert (cgroups_of(spec.session), records()) == ([], [])
    finally:
        layer.chmod(0o700)
        shutil.rmtree(session_dir(spec.session), ignore_errors=True)


def test_a_working_directory_below_the_boxs_tmp_is_made_for_its_user(bwrap):
    """One that does not exist yet on the box's own tmpfs is made there, as runc makes it, and its user's to write in
    (bwrap's --dir, after the tmpfs is mounted): it was 125, "no such file or directory"."""
    ran = cli("--workdir", "/tmp/new/deep", "--", "sh", "-c", "pwd && id -u && stat -c %u . .. && touch x && echo wrote")
    said = ran.stdout.decode().split()
    assert (ran.returncode, said[0], said[-1]) == (0, "/tmp/new/deep", "wrote"), ran.stderr
    assert said[1] == said[2] == said[3], said  # the box's user's (1000 as root; as a plain user, theirs)


@pytest.mark.skipif(ROOTLESS, reason="as root: a source the box's own host ids cannot reach is bound in its slot for them")
def test_a_source_out_of_the_boxs_reach_is_given_under_a_callers_umask_077(bwrap, tmp_path):
    """The slot's directory bwrap walks to such a source through was made under the caller's umask: 0700 under 077
    (`quinebox map` of a user with that umask failed every mission: "bwrap: Can't find source path ...: Permission denied")."""
    (tmp_path / "in").write_bytes(b"seen\n")
    (tmp_path / "in").chmod(0o644)
    os.chmod(tmp_path, 0o700)  # root's alone: the box's host ids cannot walk to it
    done = subprocess.run([QUINEBOX, "exec", "--backend", "bwrap", "-g", f"ro:{tmp_path / 'in'}", "--", "cat", str(tmp_path / "in")],
                          capture_output=True, timeout=60, preexec_fn=lambda: os.umask(0o077))
    assert (done.returncode, done.stdout) == (0, b"seen\n"), done.stderr


def _on_a_terminal(argv: list[str], keys: list[tuple[bytes, bytes]], within: float = 30) -> tuple[bytes, int]:
    """`quinebox exec --backend bwrap -t ARGV` on a pty of 30 rows and 100 columns: each key sent once the output
    shows its cue; (everything the terminal showed, the exit status)."""
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(QUINEBOX, [QUINEBOX, "exec", "--backend", "bwrap", "-t", "--", *argv])
    import fcntl
    import struct
    import termios

    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    shown, until = b"", time.monotonic() + within
    while time.monotonic() < until:
        if keys and keys[0][0] in shown:
            os.write(fd, keys.pop(0)[1])
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            shown += chunk
    done, status = os.waitpid(pid, os.WNOHANG)
    while done == 0 and time.monotonic() < until:  # the terminal reads EIO as the client lets go of it, just before it exits
        time.sleep(0.01)
        done, status = os.waitpid(pid, os.WNOHANG)
    if done == 0:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail(f"the terminal's box did not end within {within} s: {shown!r}")
    os.close(fd)
    return shown, os.waitstatus_to_exitcode(status)


def test_a_terminal_has_its_size_and_ctrl_c_reaches_the_command(bwrap):
    shown, code = _on_a_terminal(["sh", "-c", "stty size; test -t 0 && echo tty; exit 5"], [])
    assert (shown, code) == (b"30 100\r\ntty\r\n", 5)
    # `exec`: dash holds a SIGINT that comes between its echo and its fork of sleep until that foreground child ends,
    # and the child, forked after, never gets it: the box ran on to its 30 s (1 run in ~25 here, under load)
    shown, code = _on_a_terminal(["sh", "-c", "echo ready; exec sleep 30"], [(b"ready\r\n", b"\x03")])
    assert code == 130 and b"never" not in shown, shown


def test_an_agents_run(bwrap, fake_openai):
    fake_openai.steps = [sh("printf 'deliverable\\n' >&4; id -u", usage=(100, 20)), exit_()]
    result = quinebox.run("write the deliverable", input=b"")
    assert (result.returncode, result.stdout, result.termination) == (0, b"deliverable\n", "exit_success"), result.stderr
    [_, second] = fake_openai.requests
    [said] = [m["content"] for m in second.body["messages"] if m["role"] == "tool"]
    assert said.startswith(f"exit code 0\nstdout:\n{os.getuid() if ROOTLESS else 1000}\n"), said


def test_the_36_session_trees_example_runs_whole_on_bwrap(bwrap):
    """Every agent's child gets a copy-on-write (overlay) world, which bwrap once refused: each of the root's ten
    children (five of them with five of their own) ends with its own result, and the tree leaves no record and no
    mount on the host. (Before, each child was its parent's 125 with bwrap's refusal in one line.)"""
    tree = Path(__file__).resolve().parents[2] / "examples" / "tree"
    done = subprocess.run(
        [QUINEBOX, "run", "-q", "--json", "-m", f"script:{tree / 'root.yaml'}", "-g", "spawn:35", "-g", "depth:2", "Survey the ten regions"],
        stdin=subprocess.DEVNULL, capture_output=True, timeout=120,
    )
    assert (done.returncode, done.stdout) == (0, b"surveyed 10 regions with 36 agents\n"), done.stderr[-2000:]
    session = json.loads(done.stderr.splitlines()[-1])["session"]
    [fork] = [r for r in read_tape(session) if r["kind"] == "tool" and r["name"] == "fork"]
    children = json.loads(fork["result"])["children"]
    assert [(c["exit_code"], c["stdout"]) for c in children] == [
        *((0, f"surveyed region {n} in five districts\n") for n in range(1, 6)), *((0, f"surveyed region {n} alone\n") for n in range(6, 11))]
    assert _mounts_naming(session, *(c["session"] for c in children)) == [] and records() == []


def _mounts_naming(*sessions: str) -> list[str]:
    """Every mount the host (this process's namespace and init's) has whose line names one of `sessions` (its overlay's
    layers, its slot's mount point)."""
    return [line for table in ("/proc/self/mountinfo", "/proc/1/mountinfo") for line in Path(table).read_text().splitlines()
            if any(session in line for session in sessions)]


def test_an_agents_child_writes_changes_and_deletes_in_its_copy_on_write_world(bwrap, tmp_path):
    """A child's /world is an overlay of its parent's layers (bwrap has no overlay mount: the host mounts it in a mount
    namespace of the child's own). The parent's world is untouched; the child's layer holds exactly its changes, owned
    by the box's user's host ids, a deletion as overlay's whiteout, which the parent adopts as a deletion; the host
    keeps no mount and no record of either box. Before, bwrap refused the child (125)."""
    child = ("quinebox exec -- sh -c 'cat /world/a.txt; printf child > /world/a.txt; printf \"\\000\\001\\377\" > /world/bin;"
             " rm /world/gone; rm -r /world/d; mkdir /world/new; ls /world'")
    scripts(tmp_path, mission=[
        {"sh": "printf parent > a.txt; printf k > keep; printf g > gone; mkdir d; printf x > d/x"},
        {"sh": f"{child} >&4; echo --- >&4; ls >&4; cat a.txt >&4"},
        {"exit": "success"},
    ])
    done = subprocess.run([QUINEBOX, "run", "-q", "--json", "-m", f"script:{tmp_path / 'mission.yaml'}", "-g", "spawn:2", "-g", "depth:1", "go"],
                          stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
    assert (done.returncode, done.stdout) == (0, b"parenta.txt\nbin\nkeep\nnew\n---\na.txt\nd\ngone\nkeep\nparent"), done.stderr[-2000:]
    session = json.loads(done.stderr.splitlines()[-1])["session"]
    [kid] = [r["child"] for r in read_tape(session) if r["kind"] == "spawn"]
    upper = session_dir(kid) / "world" / "upper"
    owner = json.loads((session_dir(session) / "world" / "meta.json").read_text())["uid"]
    assert owner == (os.getuid() if ROOTLESS else owner) and (ROOTLESS or BASE <= owner < BASE + SLOTS * SPAN)
    assert (upper / "a.txt").read_bytes() == b"child" and (upper / "bin").read_bytes() == b"\0\1\xff"
    assert {(upper / name).lstat().st_uid for name in ("a.txt", "bin", "new")} == {owner}
    gone = (upper / "gone").lstat()
    assert stat.S_ISCHR(gone.st_mode) and gone.st_rdev == 0  # overlay's whiteout
    assert sorted(p.name for p in upper.iterdir()) == ["a.txt", "bin", "d", "gone", "new"]
    parent = session_dir(session) / "world" / "tree"
    assert {p.name: p.read_bytes() for p in parent.iterdir() if p.is_file()} == {"a.txt": b"parent", "keep": b"k", "gone": b"g"}
    assert (parent / "d" / "x").read_bytes() == b"x"
    adopted = subprocess.run([QUINEBOX, "world", "adopt", kid], capture_output=True, timeout=60)
    assert (adopted.returncode, adopted.stdout) == (0, b"M a.txt\nA bin\nD d\nD d/x\nD gone\nA new\n"), adopted.stderr
    assert sorted(p.name for p in parent.iterdir()) == ["a.txt", "bin", "keep", "new"]
    assert (parent / "a.txt").read_bytes() == b"child" and (parent / "bin").read_bytes() == b"\0\1\xff"
    assert _mounts_naming(session, kid) == [] and records() == []


def test_the_host_holds_no_mount_of_a_childs_world_while_it_runs_nor_after_its_holder_is_killed(bwrap, tmp_path):
    """The overlay is mounted in a mount namespace of the child's own box: while the child runs the host has no mount
    naming it (its layers, its mount point), and once the holder (the `quinebox run` whose broker made it) is killed
    by SIGKILL the box, its record and the empty directory it was mounted on go too."""
    scripts(tmp_path, mission=[{"sh": "quinebox exec -- sh -c 'echo up > /world/up; sleep 300'"}, {"exit": "success"}])
    proc = subprocess.Popen([QUINEBOX, "run", "-q", "-m", f"script:{tmp_path / 'mission.yaml'}", "-g", "spawn:1", "-g", "depth:1", "go"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def child() -> dict | None:
            for path in records():
                record = json.loads(path.read_text())
                if record.get("pid") and "sleep 300" in " ".join(record.get("command") or []):
                    return record
            return None
        record = wait_for(child, timeout=60, every=0.05, what="the child's bwrap box")
        kid = record["session"]
        wait_for(lambda: (session_dir(kid) / "world" / "upper" / "up").exists(), timeout=30, what="the child's write")
        assert _mounts_naming(kid) == []
    finally:
        proc.kill()
        proc.wait()
    wait_for(lambda: records() == [], timeout=10, every=0.05, what="the boxes' removal after their holder's SIGKILL")
    assert _mounts_naming(kid) == [] and not pid_alive(int(record["pid"]), str(record["start"]))
    assert [p.name for p in (state_dir() / "bwrap").iterdir()] == [] and not [p for p in Path(BOXES).glob(f"*/{kid}*")]

"""Terminals, driven through a real pseudo-terminal as a person's would be: `exec -t`, `shell`, `enter`.

The test holds the terminal's master side; quinebox gets the slave as its
stdin, stdout, stderr and controlling terminal, so a change of window size
reaches it as SIGWINCH from the kernel, and typed bytes arrive raw.
"""

import fcntl
import json
import os
import select
import struct
import subprocess
import termios
import time

import pytest
from commands import BOX_UID, QUINEBOX, qb
from live_boxes import live_boxes

from images import BUSYBOX
from quinebox.agent.store import read_tape


class Terminal:
    """quinebox running on a pseudo-terminal of its own."""

    def __init__(self, *args: str, rows: int = 30, cols: int = 100, cwd=None):
        self.master, self.slave = os.openpty()
        self.resize(rows, cols)
        self.before = termios.tcgetattr(self.slave)
        self.proc = subprocess.Popen(
            [QUINEBOX, *args], stdin=self.slave, stdout=self.slave, stderr=self.slave, cwd=cwd, preexec_fn=self._controlling, close_fds=True
        )
        self.seen = b""

    def _controlling(self) -> None:
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    def resize(self, rows: int, cols: int) -> None:
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def type(self, data: bytes) -> None:
        os.write(self.master, data)

    def wait_for(self, token: bytes, timeout: float = 30) -> bool:
        deadline = time.monotonic() + timeout
        while token not in self.seen and time.monotonic() < deadline:
            ready, _, _ = select.select([self.master], [], [], 0.1)
            if ready:
                try:
                    self.seen += os.read(self.master, 65536)
                except OSError:
                    break
        return token in self.seen

    def finish(self, timeout: float = 30) -> int:
        code = self.proc.wait(timeout=timeout)
        self.wait_for(b"\x00never", timeout=0.2)  # what was still on its way
        return code

    def restored(self) -> bool:
        return termios.tcgetattr(self.slave) == self.before

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.close(self.master)
        os.close(self.slave)


@pytest.fixture
def terminal():
    opened = []

    def open_(*args: str, **kw) -> Terminal:
        opened.append(Terminal(*args, **kw))
        return opened[-1]

    yield open_
    for t in opened:
        t.close()


def test_a_tty_box_sees_a_terminal_its_size_its_resizes_and_ctrl_c_as_a_byte(engine, terminal):
    script = "test -t 0 && echo is-a-tty; stty size; trap 'echo got-int' INT; echo ready; read line; echo read:$line; stty size; sleep 2; echo done"
    t = terminal("exec", "-it", "--", "sh", "-c", script)
    assert t.wait_for(b"ready"), t.seen
    assert b"is-a-tty" in t.seen and b"30 100" in t.seen
    t.resize(45, 132)  # the kernel tells quinebox (SIGWINCH); quinebox tells the box
    time.sleep(0.5)
    t.type(b"hello\r")
    assert t.wait_for(b"read:hello"), t.seen
    assert t.wait_for(b"45 132"), t.seen
    t.type(b"\x03")  # raw mode: a byte for the box, whose terminal turns it into SIGINT
    assert t.wait_for(b"done"), t.seen
    assert t.finish() == 0
    assert b"got-int" in t.seen
    assert t.restored()


def test_the_exit_status_passes_through_a_terminal(engine, terminal):
    t = terminal("exec", "-t", "--", "sh", "-c", "exit 7")
    assert t.finish() == 7
    assert t.restored()


def test_the_host_terminal_is_restored_when_the_box_is_killed(engine, terminal):
    t = terminal("exec", "-t", "--", "sh", "-c", "echo started; sleep 300")
    assert t.wait_for(b"started")
    assert termios.tcgetattr(t.slave) != t.before  # raw while the box has it
    [box] = [b for b in live_boxes(engine) if b.status == "running"]
    assert qb("kill", box.labels["io.quinebox.session"]).returncode == 0
    assert t.finish() == 137
    assert t.restored()


def test_a_tty_in_an_image_without_python(engine, test_images, terminal):
    t = terminal("exec", "-t", "--image", BUSYBOX.name, "--", "sh", "-c", "test -t 0 && echo tty-in-busybox")
    assert t.finish() == 0
    assert b"tty-in-busybox" in t.seen


def test_t_without_a_terminal_is_one_line_and_125_never_a_hang(engine):
    done = qb("exec", "-t", "--", "true", timeout=20)
    assert done.returncode == 125
    assert done.stderr.count(b"\n") == 1 and b"not a TTY" in done.stderr


# -- quinebox shell ----------------------------------------------------------------------


def test_shell_grants_this_directory_read_write(engine, tmp_path):
    tmp_path.chmod(0o777)  # the box runs as uid 1000 when the tests run as root
    done = qb("shell", input=b"pwd; echo made > made.txt; id -u", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == str(tmp_path).encode()
    assert (tmp_path / "made.txt").read_text() == "made\n"


def test_shell_read_only_refuses_writes(engine, tmp_path):
    tmp_path.chmod(0o755)
    (tmp_path / "seen.txt").write_text("here")
    done = qb("shell", "--read-only", input=b"cat seen.txt; echo x > new.txt", cwd=tmp_path)
    assert done.stdout == b"here"
    assert done.returncode != 0 and b"Read-only file system" in done.stderr
    assert not (tmp_path / "new.txt").exists()


def test_shell_on_a_terminal_is_interactive(engine, tmp_path, terminal):
    tmp_path.chmod(0o777)  # the box's user may enter it: as root, a host uid of the box's own
    t = terminal("shell", cwd=tmp_path)
    assert t.wait_for(b"# " if BOX_UID == 0 else b"$ "), t.seen  # the prompt: bash may drop what is typed before it is ready
    t.type(b"echo $((6 * 7))\r")
    assert t.wait_for(b"42"), t.seen
    t.type(b"exit 3\r")
    assert t.finish() == 3
    assert t.restored()


def test_shell_in_an_image_of_the_users(engine, test_images, tmp_path):
    tmp_path.chmod(0o777)
    done = qb("shell", "--image", BUSYBOX.name, input=b"probe say from-busybox x", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (0, b"from-busybox\n")


@pytest.mark.root_only
@pytest.mark.skipif(os.environ.get("QUINEBOX_BACKEND", "oci") == "docker" or os.environ.get("QUINEBOX_RUNTIME", "runc") != "runc", reason="a box's own host uid is runc's")
def test_shell_in_a_directory_its_box_may_not_enter_is_refused_in_one_line(engine, tmp_path):
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    done = qb("shell", input=b"true", cwd=private)
    assert done.returncode == 125 and done.stdout == b""
    said = done.stderr.decode()
    assert said.count("\n") == 1 and said.startswith("quinebox: the box's user, host uid ") and f"may not enter its working directory {private} (mode 0700, uid 0's): `chmod o+x {private}`" in said, said


# -- quinebox enter ----------------------------------------------------------------------


def start_agent(engine, tmp_path, env: dict) -> tuple[subprocess.Popen, str]:
    """An agent whose box writes /world/note and waits; and its session, once its box runs (a box listed before it
    started is another's: a previous test's killed agent may not be gone yet)."""
    script = tmp_path / "m.yaml"
    script.write_text(json.dumps({"turns": [{"sh": "echo the-agents-note > /world/note; echo written >&5; sleep 20"}, {"exit": "success"}]}))
    before = {b.labels["io.quinebox.session"] for b in live_boxes(engine)}
    agent = subprocess.Popen([QUINEBOX, "run", "-m", f"script:{script}", "wait"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    session = None
    deadline = time.monotonic() + 30
    while session is None and time.monotonic() < deadline:
        boxes = [b for b in live_boxes(engine) if b.status == "running" and b.labels["io.quinebox.session"] not in before]
        session = boxes[0].labels["io.quinebox.session"] if boxes else None
        time.sleep(0.2)
    if session is None:
        agent.kill()
        agent.wait()
    assert session
    return agent, session


def test_enter_sees_the_agents_world_and_is_recorded_on_its_tape(engine, tmp_path):
    # bwrap, auto's choice where usable, enters no running box (the next test): here the pass's backend, or runc
    env = {**os.environ, "QUINEBOX_BACKEND": os.environ.get("QUINEBOX_BACKEND") or "oci"}
    agent, session = start_agent(engine, tmp_path, env)
    deadline = time.monotonic() + 30
    try:
        seen = None
        while time.monotonic() < deadline:
            seen = qb("enter", session[:8], "--", "sh", "-c", "cat /world/note; id -u; exit 5")
            if seen.stdout.startswith(b"the-agents-note"):
                break
            time.sleep(0.3)
        assert (seen.returncode, seen.stdout) == (5, b"the-agents-note\n%d\n" % BOX_UID), seen.stderr
    finally:
        agent.kill()
        agent.wait()
    [entered] = [r for r in read_tape(session) if r["kind"] == "entered"][-1:]
    assert entered["argv"] == ["sh", "-c", "cat /world/note; id -u; exit 5"] and entered["exit_code"] == 5


def test_enter_on_bwrap_is_refused_in_one_line_that_says_how_to_get_a_box_to_enter(engine, tmp_path):
    agent, session = start_agent(engine, tmp_path, {**os.environ, "QUINEBOX_BACKEND": "bwrap"})
    try:
        done = qb("enter", session[:8], "--", "true")
        assert (done.returncode, done.stdout) == (125, b""), done.stderr
        said = done.stderr.decode()
        assert said.count("\n") == 1 and said.startswith(f"quinebox: box {session}: bwrap enters no running box") and said.endswith(
            "a box to enter: start it with --backend oci\n"), said
        assert agent.poll() is None  # the agent goes on
    finally:
        agent.kill()
        agent.wait()
    assert [r for r in read_tape(session) if r["kind"] == "entered"] == []


def test_enter_a_box_that_is_not_there_is_one_line(engine):
    done = qb("enter", "nosuchbox")
    assert done.returncode == 125 and done.stderr.count(b"\n") == 1 and b"no live box" in done.stderr


@pytest.mark.parametrize("backend", ["oci", "docker"])
def test_exec_in_a_long_lived_box_gets_this_terminal(engine, terminal, backend):
    made = qb("box", "create", "--backend", backend, *(["--runtime", "runc"] if backend == "oci" else []), timeout=60)
    assert made.returncode == 0, made.stderr
    box = made.stdout.decode().strip()
    try:
        t = terminal("exec", "--in", box, "-it", "--", "sh", "-c", "test -t 0 && echo is-a-tty; stty size; read line; echo read:$line; exit 5")
        assert t.wait_for(b"30 100"), t.seen
        t.type(b"typed\r")
        assert t.wait_for(b"read:typed"), t.seen
        assert t.finish() == 5 and b"is-a-tty" in t.seen
        assert t.restored()
    finally:
        qb("box", "rm", box)

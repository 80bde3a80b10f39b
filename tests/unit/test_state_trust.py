"""A state dir is trusted only when it is the user's, as ssh's StrictModes trusts ~/.ssh: its owner is the caller and
no one else may write it; what quinebox writes there is never written through a link planted there; the snapshot
key is the user's alone; and a socket is born with its mode. Each refusal is one line naming the path and the fix.

These run the `quinebox` command as a user does; none of them starts a box (each is refused, or asks for none).
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from quinebox import fdpass
from quinebox.errors import StateError

QUINEBOX = os.path.join(os.path.dirname(sys.executable), "quinebox")
NOBODY = 65534


def quinebox(*args, env, cwd=None):
    return subprocess.run([QUINEBOX, *args], env=env, cwd=cwd, capture_output=True, timeout=120)


def one_line(done) -> str:
    said = done.stderr.decode()
    assert said.count("\n") == 1 and said.startswith("quinebox: "), said
    return said


def tree(path) -> list:
    """Every entry below `path` with its kind, size and modification time: what a command may not have changed."""
    found = []
    for top, dirs, files in os.walk(path):
        for name in sorted(dirs + files):
            info = os.lstat(os.path.join(top, name))
            found.append((os.path.join(top, name), info.st_mode, info.st_size, info.st_mtime_ns))
    return sorted(found)


@pytest.mark.parametrize("command", [["exec", "--", "true"], ["ls"], ["serve", "status"]])
def test_a_relative_state_dir_is_refused_in_one_line_and_nothing_is_made(tmp_path, command):
    env = {**os.environ, "QUINEBOX_STATE_DIR": "state", "QUINEBOX_SERVE": "auto"}
    done = quinebox(*command, env=env, cwd=tmp_path)
    assert done.returncode == 125
    assert one_line(done) == "quinebox: QUINEBOX_STATE_DIR='state' is a relative path (a different state dir in each working directory): set it to an absolute one\n"
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("command", [["exec", "--", "true"], ["ls"]])
def test_a_state_dir_others_may_write_is_refused_and_left_as_it_was(tmp_path, command):
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o777)
    before = tree(state)
    done = quinebox(*command, env={**os.environ, "QUINEBOX_STATE_DIR": str(state), "QUINEBOX_SERVE": "auto"})
    assert done.returncode == 125
    assert one_line(done) == f"quinebox: the state dir {state} may be written by others (mode 0777): `chmod go-w {state}`\n"
    assert tree(state) == before


def test_a_run_dir_others_may_write_is_refused(tmp_path):
    state = tmp_path / "state"
    (state / "run").mkdir(parents=True)
    state.chmod(0o700)
    (state / "run").chmod(0o773)
    done = quinebox("exec", "--", "true", env={**os.environ, "QUINEBOX_STATE_DIR": str(state), "QUINEBOX_SERVE": "manual"})
    assert done.returncode == 125
    assert one_line(done) == f"quinebox: the run dir {state / 'run'} may be written by others (mode 0773): `chmod go-w {state / 'run'}`\n"


@pytest.mark.root_only  # another user's dir, and a process of theirs
def test_root_refuses_a_state_dir_another_user_owns_sends_it_nothing_and_writes_nothing():
    """`sudo -E`, a kept HOME, a shared QUINEBOX_STATE_DIR: the dir is nobody's, and so is the server listening in
    it. Root's command is refused before it connects: that server never hears of it (the first connection it gets
    is this test's own probe), and nothing in the dir changes."""
    base = Path(tempfile.mkdtemp(prefix="qb-nobodys-"))  # 0700 and root's, as pytest's own dirs are: nobody may not enter those
    base.chmod(0o755)
    state = base / "state"
    (state / "run").mkdir(parents=True, mode=0o700)
    for path in (state, state / "run"):
        os.chown(path, NOBODY, NOBODY)
    sock = state / "run" / "serve.2.sock"
    fake = subprocess.Popen(["/usr/bin/python3", "-c", FIRST_CONNECTION, str(sock)], user=NOBODY, group=NOBODY, extra_groups=[],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert fake.stdout.readline() == b"listening\n", fake.stderr.read()
        before = tree(state)
        done = quinebox("exec", "--", "echo", "never", env={**os.environ, "QUINEBOX_STATE_DIR": str(state), "QUINEBOX_SERVE": "auto", "ROOTS_SECRET": "s3cret"})
        assert (done.returncode, done.stdout) == (125, b"")
        assert one_line(done) == f"quinebox: the state dir {state} is uid {NOBODY}'s, not yours (uid 0): set QUINEBOX_STATE_DIR to a dir of your own (or `chown 0 {state}` if it is yours)\n"
        with socket.socket(socket.AF_UNIX) as probe:
            probe.connect(str(sock))
            probe.sendall(b"PROBE")
        assert fake.communicate(timeout=30)[0] == b"first connection said b'PROBE'\n"
        assert tree(state) == before
    finally:
        if fake.poll() is None:
            fake.kill()
        shutil.rmtree(base, ignore_errors=True)


FIRST_CONNECTION = """
import socket, sys
listener = socket.socket(socket.AF_UNIX)
listener.bind(sys.argv[1])
listener.listen(4)
print("listening", flush=True)
listener.settimeout(110)
conn, _ = listener.accept()
conn.settimeout(30)
print(f"first connection said {conn.recv(5)!r}", flush=True)
"""


def test_links_planted_at_the_servers_marker_and_log_are_never_written_through(tmp_path):
    """run/serve.started is made anew (the link there removed, never followed: its target keeps its bytes) and
    serve.log is refused in one line; no server is started, and the command itself goes on."""
    state = tmp_path / "state"
    (state / "run").mkdir(parents=True)
    state.chmod(0o700)
    (state / "run").chmod(0o700)
    victims = {name: tmp_path / f"victim-{name}" for name in ("marker", "log")}
    for name, victim in victims.items():
        victim.write_text(f"precious {name}\n")
        os.utime(victim, (time.time() - 3600, time.time() - 3600))  # old: a client takes the marker for a past start
    (state / "run" / "serve.started").symlink_to(victims["marker"])
    (state / "serve.log").symlink_to(victims["log"])
    os.utime(state / "run" / "serve.started", (time.time() - 3600, time.time() - 3600), follow_symlinks=False)
    env = {**os.environ, "QUINEBOX_STATE_DIR": str(state), "QUINEBOX_SERVE": "auto"}
    try:
        done = quinebox("exec", "--no-such-flag", env=env)  # the client tries to start a server, then the CLI says no to the flag
        assert done.returncode == 2
        assert {name: victim.read_text() for name, victim in victims.items()} == {"marker": "precious marker\n", "log": "precious log\n"}
        assert f"quinebox: {state / 'serve.log'} in the state dir is a symbolic link, which quinebox never writes through: remove it (this command runs in-process, and starts no command server)\n" in done.stderr.decode()
        assert started_with(state) == []  # a server the client started is forked before the client goes on, and waits
        assert quinebox("serve", "status", env=env).returncode == 1
    finally:
        answer = quinebox("serve", "status", "--json", env=env)
        if answer.returncode == 0:
            os.kill(json.loads(answer.stdout)["pid"], 15)


def started_with(state) -> list[int]:
    """The processes whose environment names `state` as their state dir (a command server a client started)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as environ:
                if f"QUINEBOX_STATE_DIR={state}".encode() in environ.read().split(b"\0"):
                    found.append(int(pid))
        except OSError:
            continue
    return found


@pytest.fixture
def keys(tmp_path, monkeypatch):
    """The snapshot keys' dir of a state dir of this test's own, made as quinebox makes it."""
    state = tmp_path / "state"
    monkeypatch.setenv("QUINEBOX_STATE_DIR", str(state))
    from quinebox.box.live import snapshots

    snapshots._user_key()
    return state / "snapshots" / ".keys"


def test_the_snapshot_key_is_made_the_users_alone(keys):
    from quinebox.box.live import snapshots

    key = keys / str(os.getuid())
    assert (os.stat(keys).st_mode & 0o777, os.stat(key).st_mode & 0o777, key.stat().st_size) == (0o700, 0o600, 32)
    assert snapshots._user_key() == key.read_bytes()


@pytest.mark.parametrize("plant", ["a link to a key", "a key others may read", "a keys' dir others may enter"])
def test_a_planted_or_exposed_snapshot_key_is_refused_never_used(keys, tmp_path, plant):
    from quinebox.box.live import snapshots

    key = keys / str(os.getuid())
    if plant == "a link to a key":
        planted = tmp_path / "planted"
        planted.write_bytes(b"k" * 32)
        planted.chmod(0o600)
        key.unlink()
        key.symlink_to(planted)
        said = f"the snapshot key {key} is a symbolic link, which quinebox never reads through: remove it (what it sealed cannot be restored)"
    elif plant == "a key others may read":
        key.chmod(0o644)
        said = f"the snapshot key {key} is open to others (mode 0644): `chmod go= {key}`"
    else:
        keys.chmod(0o755)
        said = f"the dir of snapshot keys {keys} is open to others (mode 0755): `chmod go= {keys}`"
    with pytest.raises(StateError) as refused:
        snapshots._user_key()
    assert str(refused.value) == said


@pytest.mark.root_only  # a file of another user's
def test_a_snapshot_key_planted_by_another_user_is_refused_never_used(keys):
    from quinebox.box.live import snapshots

    key = keys / "0"
    key.write_bytes(b"planted-by-nobody".ljust(32, b"!"))
    os.chown(key, NOBODY, NOBODY)
    with pytest.raises(StateError) as refused:
        snapshots._user_key()
    assert str(refused.value) == f"the snapshot key {key} is uid {NOBODY}'s, not yours (uid 0): remove it (what it sealed cannot be restored)"


def test_a_socket_is_born_with_its_mode_never_chmodded_after_others_could_connect(tmp_path, monkeypatch):
    """Under umask 0 a Unix socket's file would be born 0777: whoever found it between bind and chmod could connect."""
    seen = []
    chmod = os.chmod

    def watching(path, mode, **kwargs):
        seen.append(os.lstat(path).st_mode & 0o777)
        chmod(path, mode, **kwargs)

    monkeypatch.setattr(os, "chmod", watching)
    old = os.umask(0)
    try:
        listener = fdpass.listen(str(tmp_path / "s.sock"), mode=0o600, backlog=1)
    finally:
        os.umask(old)
    listener.close()
    assert seen and set(seen) == {0o600}, [oct(mode) for mode in seen]
    assert os.lstat(tmp_path / "s.sock").st_mode & 0o777 == 0o600


@pytest.mark.root_only  # gives the file to another user
def test_a_socket_can_be_born_another_users(tmp_path):
    listener = fdpass.listen(str(tmp_path / "s.sock"), mode=0o600, backlog=1, owner=(NOBODY, NOBODY))
    listener.close()
    info = os.lstat(tmp_path / "s.sock")
    assert (info.st_uid, info.st_gid, info.st_mode & 0o777) == (NOBODY, NOBODY, 0o600)

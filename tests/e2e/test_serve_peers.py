"""Whom the command server, the pool and a box's owner serve: their own user's processes as free as themselves.

A process of the same user that is confined — Landlock with no write anywhere (as an agent CLI jails itself),
NoNewPrivs, another network namespace — must not get the server to act for it with the server's freedom: its
command is handed back and runs in-process, under its own confinement; the pool lends it no warm box; a box's
owner answers it one line. And the client sends nothing to a server socket another user answers on.
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from commands import QUINEBOX, ROOTLESS, qb, wait_for

from quinebox.state import SERVE_SOCKET

CONFINED = str(Path(__file__).resolve().parents[1] / "confined.py")
#: Each confinement, as the argv that runs a command under it.
CONFINEMENTS = {
    "landlock": [sys.executable, CONFINED, "landlock"],
    "no-new-privs": [sys.executable, CONFINED, "nnp"],
    "net-namespace": ["unshare", "-rn"] if ROOTLESS else ["unshare", "-n"],
}


def quinebox(*args, env, prefix=(), **options):
    return subprocess.run([*prefix, QUINEBOX, *args], env=env, capture_output=True, timeout=120, **options)


def served(env) -> int:
    said = quinebox("serve", "status", "--json", env=env)
    assert said.returncode == 0, said.stderr
    return json.loads(said.stdout)["served"]


@pytest.fixture
def server(tmp_path):
    """A command server (no pool) on a state dir of its own; the environment that reaches it."""
    env = {**os.environ, "QUINEBOX_STATE_DIR": str(tmp_path / "state"), "QUINEBOX_SERVE": "manual"}
    started = quinebox("serve", "--background", "--pool", "0", env=env)
    assert started.returncode == 0, started.stderr
    yield env
    quinebox("serve", "stop", env=env)


@pytest.mark.parametrize("confinement", sorted(CONFINEMENTS))
def test_a_confined_process_gets_its_command_handed_back_never_run_with_the_servers_freedom(server, tmp_path, confinement):
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o777)  # the box's user may write it (a root-made box's is not the caller)
    assert quinebox("exec", "-g", f"rw:{out}=/out", "--", "sh", "-c", "echo free > /out/free", env=server).returncode == 0
    assert (out / "free").read_text() == "free\n" and served(server) == 1  # a free process of the user's: served
    before = served(server)
    done = quinebox("exec", "-g", f"rw:{out}=/out", "--", "sh", "-c", "echo confined > /out/confined", env=server, prefix=CONFINEMENTS[confinement])
    assert served(server) == before, done.stderr  # the server ran nothing for it: it ran in-process, confined as it is
    if confinement == "landlock":  # no write anywhere, and none was made for it
        assert done.returncode != 0 and not (out / "confined").exists(), done.stderr


def test_the_pool_lends_no_warm_box_to_a_confined_process(tmp_path):
    env = {**os.environ, "QUINEBOX_STATE_DIR": str(tmp_path / "state"), "QUINEBOX_SERVE": "manual"}
    assert quinebox("serve", "--background", "--pool", "1", env=env).returncode == 0
    try:
        wait_for(lambda: json.loads(quinebox("serve", "status", "--json", env=env).stdout).get("pool"), what="the pool answering")
        ask = "import json, sys; from quinebox import fdpass; from quinebox.state import pool_socket; print(json.dumps(fdpass.ask(str(pool_socket()), {'kind': 'stats'}, 10)))"
        free = json.loads(subprocess.run([sys.executable, "-c", ask], env=env, capture_output=True, timeout=60, check=True).stdout)
        assert free["kind"] == "stats"
        confined = subprocess.run([*CONFINEMENTS["no-new-privs"], sys.executable, "-c", ask], env=env, capture_output=True, timeout=60)
        assert confined.returncode == 0, confined.stderr
        answer = json.loads(confined.stdout)
        assert answer == {"kind": "refused", "error": "the warm pool serves no process less free than itself (NoNewPrivs): start the box cold"}, confined.stderr
    finally:
        quinebox("serve", "stop", env=env)


def test_a_boxs_owner_answers_a_confined_process_one_line_and_does_nothing_for_it():
    made = qb("box", "create", "--name", "owner-peers", timeout=60)
    assert made.returncode == 0, made.stderr
    box = made.stdout.decode().strip()
    try:
        free = qb("exec", "--in", box, "--", "echo", "for-the-free")
        assert (free.returncode, free.stdout) == (0, b"for-the-free\n"), free.stderr
        confined = subprocess.run([*CONFINEMENTS["no-new-privs"], QUINEBOX, "exec", "--in", box, "--", "echo", "for-the-confined"], capture_output=True, timeout=120)
        assert confined.returncode == 125 and confined.stdout == b"", confined.stderr
        assert confined.stderr == b"quinebox: a box's owner answers no process less free than itself (NoNewPrivs): ask from outside that sandbox\n"
    finally:
        qb("box", "rm", box)


@pytest.mark.root_only  # a socket another user listens on
def test_a_server_socket_another_user_answers_on_is_sent_not_a_byte(tmp_path):
    """A process of another user (nobody) answers at the state dir's server socket: the client reads its uid as it
    connects and sends it nothing — no stdin, no argv, no environment — and runs the command in-process."""
    theirs = Path(tempfile.mkdtemp(prefix="qb-theirs-"))
    try:
        os.chown(theirs, 65534, 65534)
        fake = subprocess.Popen(
            ["/usr/bin/python3", "-c", FAKE_SERVER, str(theirs / "s.sock")], user=65534, group=65534, extra_groups=[],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        assert fake.stdout.readline() == b"listening\n", fake.stderr.read()
        state = tmp_path / "state"
        (state / "run").mkdir(parents=True, mode=0o700)
        os.rename(theirs / "s.sock", state / "run" / SERVE_SOCKET)  # a bound socket answers wherever its file goes
        env = {**os.environ, "QUINEBOX_STATE_DIR": str(state), "QUINEBOX_SERVE": "auto", "SECRET_OF_ROOT": "s3cret"}
        done = quinebox("exec", "--", "echo", "in-process", env=env, input=b"root's stdin")
        assert (done.returncode, done.stdout) == (0, b"in-process\n"), done.stderr
        line = done.stderr.decode()
        assert line.count("\n") == 1 and "answers as uid 65534, not as you (uid 0), and was sent nothing" in line, line
        got, _ = fake.communicate(timeout=30)
        assert got == b"received 0 bytes\n"  # it was connected to (that is how its uid was read), and sent nothing
        assert not (state / "run" / "serve.started").exists() and not (state / "serve.log").exists()  # and no server was started beside it
    finally:
        if fake.poll() is None:
            fake.kill()
        subprocess.run(["rm", "-rf", str(theirs)], timeout=30)


FAKE_SERVER = """
import socket, sys
listener = socket.socket(socket.AF_UNIX)
listener.bind(sys.argv[1])
listener.listen(1)
print("listening", flush=True)
listener.settimeout(110)
conn, _ = listener.accept()
conn.settimeout(60)
got = conn.recv(1 << 20)  # b"" at once when the client closes without a word
print(f"received {len(got)} bytes", flush=True)
"""


def test_the_server_check_costs_a_client_well_under_a_millisecond(server):
    """What the server reads of each peer (fdpass.unfree): ~0.1 ms, measured here in-process, a budget of 1 ms."""
    import socket

    from quinebox import fdpass

    ours, theirs = socket.socketpair()
    with ours, theirs:
        assert fdpass.unfree(ours) is None
        began = time.perf_counter()
        for _ in range(200):
            fdpass.unfree(ours)
        assert (time.perf_counter() - began) / 200 < 0.001

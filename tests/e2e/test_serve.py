"""The command server and its thin client, on the real engine: the same behaviour as the CLI, without its start-up.

Every test here starts its own server in a state dir of its own, so the rest
of the suite never goes through one unless it asks to (QUINEBOX_TEST_SERVE=1,
a second CI pass over the CLI tests).
"""

import json
import os
import signal
import subprocess
import time

import docker
import pytest
from commands import QUINEBOX
from live_boxes import local_boxes

from quinebox.box.policy import LABEL_SESSION
from quinebox.box.pool.keeper import SETTLE_TIMEOUT


@pytest.fixture
def served(tmp_path):
    """A state dir with a command server on it; the environment that reaches it."""
    env = {**os.environ, "QUINEBOX_STATE_DIR": str(tmp_path / "state")}
    env["QUINEBOX_SERVE"] = "manual"
    # No pool: these are the server's and thin client's tests; tests/e2e/test_pool.py is the pool's.
    started = subprocess.run([QUINEBOX, "serve", "--background", "--pool", "0"], env=env, capture_output=True, timeout=60)
    assert started.returncode == 0, started.stderr
    yield env
    subprocess.run([QUINEBOX, "serve", "stop"], env=env, capture_output=True, timeout=60)


def quinebox(*args, env, **options):
    return subprocess.run([QUINEBOX, *args], env=env, capture_output=True, timeout=120, **options)


def served_count(env) -> int:
    said = quinebox("serve", "status", "--json", env=env)
    assert said.returncode == 0, said.stderr
    return json.loads(said.stdout)["served"]


def test_status_says_whether_a_server_answers(tmp_path):
    env = {**os.environ, "QUINEBOX_STATE_DIR": str(tmp_path / "state")}
    none = quinebox("serve", "status", env=env)
    assert (none.returncode, none.stderr) == (1, b"quinebox: no command server answers: `quinebox serve --background` starts one\n")
    assert quinebox("serve", "--background", env=env).returncode == 0
    assert quinebox("serve", "status", env=env).stdout.startswith(b"serving: pid ")
    second = quinebox("serve", "--background", env=env)
    assert second.returncode == 125 and b"a command server already answers" in second.stderr
    assert quinebox("serve", "stop", env=env).returncode == 0
    assert quinebox("serve", "status", env=env).returncode == 1


def test_bytes_exit_codes_errors_and_the_environment_are_the_clis(served):
    before = served_count(served)
    done = quinebox("exec", "-g", "env:ONLY_THE_CLIENT", "--json", "--", "sh", "-c", "cat; echo \"$ONLY_THE_CLIENT\" >&2; exit 3",
                    env={**served, "ONLY_THE_CLIENT": "from-the-client"}, input=b"\x00material\xff")
    assert (done.returncode, done.stdout) == (3, b"\x00material\xff"), done.stderr
    lines = done.stderr.decode().splitlines()
    assert lines[0] == "from-the-client" and json.loads(lines[1])["exit_code"] == 3
    bad = quinebox("exec", "-g", "bogus", "--", "true", env=served)
    assert (bad.returncode, bad.stderr.count(b"\n")) == (125, 1) and bad.stderr.startswith(b"quinebox: bad grant 'bogus'")
    usage = quinebox("exec", "--no-such-flag", env=served)
    assert usage.returncode == 2
    cold = quinebox("exec", "--", "sh", "-c", "exit 7", env={**served, "QUINEBOX_SERVE": "off"})
    assert cold.returncode == 7
    assert served_count(served) == before + 3  # the cold one did not go through it


def test_the_clients_cwd_and_its_relative_grants(served, tmp_path):
    here = tmp_path / "work"
    here.mkdir()
    here.chmod(0o755)
    (here / "notes").write_text("relative\n")
    (here / "notes").chmod(0o644)
    done = quinebox("exec", "-g", "ro:.=/in", "--", "cat", "/in/notes", env=served, cwd=here)
    assert (done.returncode, done.stdout) == (0, b"relative\n")


def boxes_of(env: dict, session_prefix: str = "") -> list[dict]:
    """Boxes as the engine and the OCI runtimes of `env`'s state dir list them (one request each: a box removed
    meanwhile is simply not there)."""
    rootless = os.environ.get("QUINEBOX_TEST_ROOTLESS") == "1"  # no engine to list: the runtimes' boxes alone
    listed = [] if rootless else docker.from_env(timeout=10).api.containers(all=True, filters={"label": LABEL_SESSION})
    mine = os.environ["QUINEBOX_STATE_DIR"]
    os.environ["QUINEBOX_STATE_DIR"] = env["QUINEBOX_STATE_DIR"]
    try:
        listed += local_boxes()
    finally:
        os.environ["QUINEBOX_STATE_DIR"] = mine
    return [box for box in listed if box["Labels"][LABEL_SESSION].startswith(session_prefix)]


def start_sleeper(env):
    proc = subprocess.Popen([QUINEBOX, "exec", "--json", "--", "sh", "-c", "echo started; sleep 300"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline() == b"started\n"
    [box] = [box for box in boxes_of(env) if "sleep 300" in box["Command"]]
    return proc, box["Labels"][LABEL_SESSION]


def test_sigkill_of_the_client_takes_its_box_within_a_second(served):
    proc, session = start_sleeper(served)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    until = time.monotonic() + 1.0
    while boxes_of(served, session) and time.monotonic() < until:
        time.sleep(0.05)
    assert boxes_of(served, session) == []


def test_signals_reach_the_command_as_they_would_the_cli(served):
    proc, session = start_sleeper(served)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 128 + signal.SIGTERM
    assert boxes_of(served, session) == []


def test_stopping_the_server_ends_no_command_it_runs(served):
    proc = subprocess.Popen([QUINEBOX, "exec", "--", "sh", "-c", "echo started; sleep 2; echo finished"], env=served, stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b"started\n"
    assert quinebox("serve", "stop", env=served).returncode == 0
    assert proc.stdout.read() == b"finished\n" and proc.wait(30) == 0
    assert quinebox("exec", "--", "echo", "cold", env=served).stdout == b"cold\n"  # no server: the CLI itself


def test_a_server_in_the_foreground_exits_once_stopped(tmp_path):
    """With its default pool it probes the runtime, whose box's keeper lives until the server has exited: waiting for
    every child at the end, the server once waited for that keeper forever (and `serve stop` said it had stopped)."""
    env = {**os.environ, "QUINEBOX_STATE_DIR": str(tmp_path / "state"), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    env["QUINEBOX_SERVE"] = "manual"
    (tmp_path / "config" / "quinebox").mkdir(parents=True)
    (tmp_path / "config" / "quinebox" / "config.yaml").write_text("pool: {after: 0}\n")  # the default pool, started with the server
    server = subprocess.Popen([QUINEBOX, "serve"], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        for _ in range(600):
            if quinebox("serve", "status", env=env).returncode == 0:
                break
            time.sleep(0.1)
        assert quinebox("exec", "--", "echo", "served", env=env).stdout == b"served\n"
        assert quinebox("serve", "stop", env=env).returncode == 0
        # Its pool's keeper, which it waits for, lets a warm box whose make is under way (the one the exec's claim had it
        # make anew) finish first, up to SETTLE_TIMEOUT on a loaded machine: 30 s was too short in CI's rootless pass.
        assert server.wait(timeout=SETTLE_TIMEOUT + 30) == 0, server.stderr.read()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(timeout=30)


def test_a_terminal_through_the_server(served):
    import select

    master, slave = os.openpty()
    proc = subprocess.Popen([QUINEBOX, "exec", "-t", "--", "sh", "-c", "test -t 0 && echo tty-in-the-box"], env=served, stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    seen = b""
    until = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < until:
        if select.select([master], [], [], 0.2)[0]:
            try:
                seen += os.read(master, 4096)
            except OSError:
                break
    assert proc.wait(30) == 0
    assert b"tty-in-the-box" in seen


def test_a_client_that_says_nothing_or_nonsense_does_not_stop_the_server(served):
    import socket

    from quinebox.state import serve_socket

    path = str(serve_socket()).replace(os.environ["QUINEBOX_STATE_DIR"], served["QUINEBOX_STATE_DIR"])
    for junk in (b"", b"not json\n", b'{"kind": "run", "argv": ["exec"]}\n', b"\xff" * 70000):
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(path)
            sock.sendall(junk)
    with socket.socket(socket.AF_UNIX) as silent:  # says nothing until the server gives up on it
        silent.connect(path)
        time.sleep(2.5)
    assert quinebox("exec", "--", "echo", "still-serving", env=served).stdout == b"still-serving\n"
    assert served_count(served) == 1

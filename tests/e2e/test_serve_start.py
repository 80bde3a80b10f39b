"""The command server starts itself, as chg's does: the first command runs in-process and starts one; the next
goes through it; a server with old code or config hands a command back and makes way; an idle one exits.

Each test has a state dir and a config dir of its own, and QUINEBOX_SERVE=auto (the rest of the suite runs
with `manual`: tests/conftest.py). Every server a test starts is stopped by its pid at the end, whatever happened.
"""

import json
import os
import select
import signal
import subprocess
import time

import pytest
from commands import QUINEBOX, wait_for
from test_serve import boxes_of

from quinebox.state import SERVE_SOCKET


def quinebox(*args, env, **options):
    return subprocess.run([QUINEBOX, *args], env=env, capture_output=True, timeout=120, **options)


def status(env) -> dict | None:
    said = quinebox("serve", "status", "--json", env=env)
    return json.loads(said.stdout) if said.returncode == 0 else None


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.fixture
def auto(tmp_path):
    """A fresh state dir and config dir, with `auto`; the servers started in it are ended by pid at the end."""
    config = tmp_path / "config" / "quinebox"
    config.mkdir(parents=True)
    env = {**os.environ, "QUINEBOX_STATE_DIR": str(tmp_path / "state"), "XDG_CONFIG_HOME": str(tmp_path / "config"), "QUINEBOX_SERVE": "auto"}
    seen: set[int] = set()
    yield env, config / "config.yaml", seen
    answer = status(env)
    if answer:
        seen.add(answer["pid"])
    for pid in seen:
        if not gone(pid):
            os.kill(pid, signal.SIGTERM)
    for pid in seen:
        wait_for(lambda pid=pid: gone(pid), what=f"server {pid} ended", timeout=30)


def test_the_first_command_starts_a_server_and_the_next_goes_through_it(auto):
    env, _, seen = auto
    first = quinebox("exec", "--", "sh", "-c", "cat; echo diagnostics >&2; exit 3", env=env, input=b"material\n")
    assert (first.returncode, first.stdout, first.stderr) == (3, b"material\n", b"diagnostics\n")
    answer = wait_for(lambda: status(env), what="a server answering")
    seen.add(answer["pid"])
    assert answer["served"] == 0 and answer["idle_exit"] == 900  # the first ran in-process; 15 minutes by default
    second = quinebox("exec", "--", "sh", "-c", "cat; echo diagnostics >&2; exit 4", env=env, input=b"more\n")
    assert (second.returncode, second.stdout, second.stderr) == (4, b"more\n", b"diagnostics\n")
    assert status(env)["served"] == 1
    log = os.path.join(env["QUINEBOX_STATE_DIR"], "serve.log")
    assert open(log).read().count("serving on") == 1


def test_manual_and_off_start_no_server_and_any_other_value_is_one_line(auto):
    env, _, _ = auto
    for mode in ("manual", "off"):
        done = quinebox("exec", "--", "echo", mode, env={**env, "QUINEBOX_SERVE": mode})
        assert (done.returncode, done.stdout) == (0, f"{mode}\n".encode())
    time.sleep(1)
    assert status(env) is None and not os.path.exists(os.path.join(env["QUINEBOX_STATE_DIR"], "serve.log"))
    bad = quinebox("exec", "--", "true", env={**env, "QUINEBOX_SERVE": "yes"})
    assert (bad.returncode, bad.stderr) == (2, b"quinebox: QUINEBOX_SERVE='yes' is none of auto, manual or off; set one of those, or unset it\n")
    assert status(env) is None


def test_a_server_exits_once_idle_and_leaves_nothing_but_waits_for_the_command_it_runs(auto):
    env, _, seen = auto
    assert quinebox("exec", "--", "true", env={**env, "QUINEBOX_SERVE": "off"}).returncode == 0  # the image, unpacked first
    before = {box["Id"] for box in boxes_of(env)}  # the engine's boxes of other tests' state dirs, which are not this server's
    assert quinebox("serve", "--background", "--idle", "3s", env=env).returncode == 0
    answer = status(env)
    pid = answer["pid"]
    seen.add(pid)
    assert answer["idle_exit"] == 3
    long = subprocess.Popen([QUINEBOX, "exec", "--", "sh", "-c", "echo started; sleep 5; echo done"], env=env, stdout=subprocess.PIPE)
    assert long.stdout.readline() == b"started\n"
    time.sleep(4)  # more than the idle time passes while a command runs: that is not idle
    assert not gone(pid) and status(env)["served"] == 1
    assert long.stdout.read() == b"done\n" and long.wait(30) == 0
    wait_for(lambda: gone(pid), what="the idle server gone", timeout=3 + 5 + 10)  # its idle time, its check interval, slack
    run = os.path.join(env["QUINEBOX_STATE_DIR"], "run")
    assert not os.path.exists(os.path.join(run, SERVE_SOCKET))
    wait_for(lambda: [box for box in boxes_of(env) if box["Id"] not in before] == [], what="the server's boxes gone", timeout=30)
    assert "idle for 3 s: exiting" in open(os.path.join(env["QUINEBOX_STATE_DIR"], "serve.log")).read()


def test_a_server_whose_config_changed_hands_the_command_back_and_a_new_one_takes_over(auto):
    env, config, seen = auto
    config.write_text("serve: {idle: 10m}\n")
    assert quinebox("exec", "--", "true", env=env).returncode == 0
    old = wait_for(lambda: status(env), what="a server answering")
    seen.add(old["pid"])
    assert old["idle_exit"] == 600
    config.write_text("serve: {idle: 20m}\n")
    done = quinebox("exec", "--", "sh", "-c", "echo ran; exit 5", env=env)
    assert (done.returncode, done.stdout, done.stderr) == (5, b"ran\n", b"")  # in-process, once: the old server ran nothing
    wait_for(lambda: gone(old["pid"]), what="the old server gone", timeout=30)
    new = wait_for(lambda: status(env), what="a new server answering")
    seen.add(new["pid"])
    assert new["pid"] != old["pid"] and new["idle_exit"] == 1200 and new["served"] == 0
    assert quinebox("exec", "--", "echo", "through", env=env).stdout == b"through\n" and status(env)["served"] == 1
    log = open(os.path.join(env["QUINEBOX_STATE_DIR"], "serve.log")).read()
    assert log.count("serving on") == 2 and "the code or config.yaml changed since this server started: exiting" in log


def test_a_server_that_cannot_start_is_tried_once_and_commands_run_in_process(auto):
    env, config, _ = auto
    config.write_text("serve: {idle: soon}\n")  # only the server reads `serve:`: a command in-process does not mind
    for n in range(3):
        done = quinebox("exec", "--", "sh", "-c", f"echo {n}; exit {n}", env=env)
        assert (done.returncode, done.stdout) == (n, f"{n}\n".encode())
    log = os.path.join(env["QUINEBOX_STATE_DIR"], "serve.log")
    refusal = "quinebox: bad idle time for the command server: bad duration 'soon'"
    wait_for(lambda: os.path.exists(log) and refusal in open(log).read(), what="the server's one-line refusal in serve.log")
    time.sleep(1)
    assert open(log).read().count(refusal) == 1  # not once per command: the next try is 30 s on
    assert status(env) is None


def test_the_server_a_command_starts_holds_none_of_the_callers_descriptors(auto):
    """A caller that passed the command a pipe (a make jobserver, `$(...)`) sees its end when the command ends."""
    env, _, seen = auto
    read, write = os.pipe()
    done = subprocess.run([QUINEBOX, "exec", "--", "echo", "out"], env=env, capture_output=True, timeout=120, pass_fds=(write,))
    os.close(write)
    assert (done.returncode, done.stdout) == (0, b"out\n")
    answer = wait_for(lambda: status(env), what="a server answering")
    seen.add(answer["pid"])
    assert select.select([read], [], [], 10)[0] == [read], "the write end is still held"
    assert os.read(read, 1) == b""  # EOF: no process holds the write end, the server included
    os.close(read)
    held = [os.readlink(f"/proc/{answer['pid']}/fd/{fd}") for fd in os.listdir(f"/proc/{answer['pid']}/fd")]
    assert not [link for link in held if link.startswith("pipe:") and link not in keeper_pipes(answer["pid"])], held


def keeper_pipes(server: int) -> set[str]:
    """The pipes the server's boxes' keeper (box/backends/keeper.py, its child) reads: the server's own, not a caller's."""
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            name, _, rest = open(f"/proc/{pid}/stat").read().rpartition(") ")
            if name.endswith("(quinebox-keeper") and int(rest.split()[1]) == server:
                found.add(os.readlink(f"/proc/{pid}/fd/0"))
        except OSError:
            continue
    return found

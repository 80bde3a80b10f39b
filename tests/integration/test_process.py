"""One process type with subprocess's meaning (box/live/execs.py's Process), asserted alike for each kind on runc:
a box's main process (`quinebox.Popen`), an exec in a lasting box (`Sandbox.Popen`), and an exec in a box another
process owns (an attached Sandbox's, which the owner runs: handed.py).

What a caller of subprocess depends on: a `wait` or `communicate` whose timeout runs out raises TimeoutExpired and
leaves the process running (a second `communicate` finishes it, its output whole); `terminate` is SIGTERM (a
trap runs; no trap: 143), then SIGKILL after the grace; `kill` is SIGKILL (137); `send_signal` reaches the command
inside the box; `pid` is the host's view of it.
"""

import signal
import subprocess
import time

import pytest

import quinebox
from quinebox.box.live import execs

KINDS = ["box", "exec", "attached"]
#: A command that says it is ready once its traps are set, then waits to be signalled.
TRAPPED = "trap 'echo {said}; exit {code}' {sig}; echo ready; while :; do sleep 0.05; done"


@pytest.fixture(scope="module")
def owner():
    with quinebox.Sandbox(backend="oci", runtime="runc") as sb:
        yield sb


@pytest.fixture(params=KINDS)
def start(request, owner):
    """`start(argv, **streams)` for each kind of process; each is ended after the test."""
    started = []
    attached = quinebox.Sandbox.connect(owner.id) if request.param == "attached" else None

    def start(argv, **streams):
        if request.param == "box":
            proc = quinebox.Popen(argv, backend="oci", runtime="runc", **streams)
        else:
            proc = (attached or owner).Popen(argv, **streams)
        started.append(proc)
        return proc

    start.kind = request.param
    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def ready(proc):
    assert proc.stdout.readline() == b"ready\n"


def test_a_wait_that_times_out_raises_and_leaves_it_running_and_communicate_finishes_it(start):
    proc = start(["sh", "-c", "read x; echo got $x; echo err >&2"], stdin=quinebox.PIPE, stdout=quinebox.PIPE, stderr=quinebox.PIPE)
    with pytest.raises(subprocess.TimeoutExpired) as raised:
        proc.wait(timeout=0.3)
    assert raised.value.timeout == 0.3 and list(raised.value.cmd) == ["sh", "-c", "read x; echo got $x; echo err >&2"]
    assert proc.poll() is None and proc.returncode is None
    assert proc.communicate(b"input\n", timeout=60) == (b"got input\n", b"err\n")
    assert proc.returncode == 0 and proc.args == ("sh", "-c", "read x; echo got $x; echo err >&2")


def test_a_communicate_that_times_out_leaves_it_running_and_a_second_one_gets_the_whole_output(start):
    proc = start(["sh", "-c", "echo first; sleep 1.5; echo second"], stdin=quinebox.DEVNULL, stdout=quinebox.PIPE)
    with pytest.raises(subprocess.TimeoutExpired) as raised:
        proc.communicate(timeout=0.3)
    assert raised.value.output in (None, b"", b"first\n")  # what was read by then
    assert proc.poll() is None
    assert proc.communicate(timeout=60) == (b"first\nsecond\n", None)
    assert proc.returncode == 0


def test_send_signal_reaches_the_command_inside_the_box(start):
    proc = start(["sh", "-c", TRAPPED.format(said="usr1", code=5, sig="USR1")], stdin=quinebox.DEVNULL, stdout=quinebox.PIPE)
    ready(proc)
    proc.send_signal(signal.SIGUSR1)
    assert proc.communicate(timeout=60) == (b"usr1\n", None)
    assert proc.returncode == 5


def test_terminate_is_sigterm_which_a_trap_hears(start):
    proc = start(["sh", "-c", TRAPPED.format(said="term", code=3, sig="TERM")], stdin=quinebox.DEVNULL, stdout=quinebox.PIPE)
    ready(proc)
    proc.terminate()
    assert proc.communicate(timeout=60) == (b"term\n", None)
    assert proc.returncode == 3


def test_terminate_ends_an_untrapped_command_with_143_and_kill_with_137(start):
    terminated = start(["sh", "-c", "echo ready; while :; do sleep 0.05; done"], stdin=quinebox.DEVNULL, stdout=quinebox.PIPE)
    killed = start(["sh", "-c", "echo ready; while :; do sleep 0.05; done"], stdin=quinebox.DEVNULL, stdout=quinebox.PIPE)
    ready(terminated)
    ready(killed)
    terminated.terminate()
    killed.kill()
    assert (terminated.wait(60), killed.wait(60)) == (128 + signal.SIGTERM, 128 + signal.SIGKILL)


def test_terminate_kills_what_ignores_sigterm_once_the_grace_has_passed(start, monkeypatch):
    monkeypatch.setattr(execs, "TERMINATE_GRACE", 1.0)
    proc = start(["sh", "-c", "trap '' TERM; echo ready; while :; do sleep 0.05; done"], stdin=quinebox.DEVNULL, stdout=quinebox.PIPE)
    ready(proc)
    proc.terminate()
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(0.5)  # SIGTERM was ignored: it runs through the grace
    assert proc.wait(60) == 128 + signal.SIGKILL


def test_pid_is_the_hosts_view_of_it(start):
    proc = start(["sleep", "60"], stdin=quinebox.DEVNULL)
    if start.kind == "attached":
        assert proc.pid is None  # the owner's child, not this process's to see
        return

    def seen():
        with open(f"/proc/{proc.pid}/cmdline", "rb") as cmdline:
            return cmdline.read().split(b"\0")

    if start.kind == "box":
        assert seen()[:3] == [b"/.quinebox/bin/init", b"--", b"sleep"], seen()  # the box's (native) init, the command's parent
    else:  # the command's own process from its start: a fork in the box that becomes `sleep` once it has exec'd
        deadline = time.monotonic() + 10
        while seen()[:2] != [b"sleep", b"60"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert seen()[:2] == [b"sleep", b"60"], seen()


def test_a_with_block_waits_for_it_and_closes_its_pipes(start):
    with start(["sh", "-c", "cat; exit 4"], stdin=quinebox.PIPE, stdout=quinebox.PIPE) as proc:
        proc.stdin.write(b"abc")
        proc.stdin.close()
        assert proc.stdout.read() == b"abc"
    assert proc.returncode == 4 and proc.stdout.closed


def test_exec_check_raises_called_process_error_with_its_outputs(owner):
    with pytest.raises(subprocess.CalledProcessError) as raised:
        owner.exec(["sh", "-c", "echo out; echo err >&2; exit 9"], check=True)
    error = raised.value
    assert (error.returncode, tuple(error.cmd), error.output, error.stderr) == (9, ("sh", "-c", "echo out; echo err >&2; exit 9"), b"out\n", b"err\n")
    assert owner.exec(["true"], check=True).returncode == 0
    timed = owner.exec(["sleep", "30"], timeout=0.5)  # exec's timeout still kills and says so, as documented
    assert (timed.returncode, timed.timed_out) == (124, True)


def test_an_unknown_sandbox_option_is_one_line_before_any_box_is_made():
    for make in (quinebox.Sandbox, quinebox.Sandbox.detached):
        with pytest.raises(TypeError) as raised:
            make(grant=["mem:64m"])
        assert str(raised.value).startswith("unknown box option 'grant' (did you mean 'grants'?)")
        assert "\n" not in str(raised.value)
    with pytest.raises(TypeError, match=r"^a Sandbox's time limit is ttl=, not timeout="):
        quinebox.Sandbox(timeout=5)


def test_a_sandbox_takes_its_box_whole_as_box_options():
    with quinebox.Sandbox(quinebox.BoxOptions(workdir="/tmp", backend="oci"), ttl=60) as sb:
        assert (sb.workdir, sb.exec(["pwd"]).stdout) == ("/tmp", b"/tmp\n")

"""quinebox.exec and quinebox.Popen against the real engine: bytes, codes, streams, cleanup."""

import os
import subprocess
import threading
import time

import pytest
from live_boxes import live_boxes, soon

import quinebox
from quinebox.box.policy import LABEL_SESSION


def boxes_of(engine, session):
    return live_boxes(engine, f"{LABEL_SESSION}={session}")


def test_binary_round_trip_of_50_mb_is_byte_exact(engine):
    data = os.urandom(50 << 20)
    result = quinebox.exec(["cat"], input=data)
    assert result.returncode == 0
    assert result.stdout == data
    assert result.stderr == b""


def test_stdout_and_stderr_stay_separate_and_exact(engine):
    result = quinebox.exec(["sh", "-c", r"printf 'out\000put'; printf 'err\nors' >&2; printf more"])
    assert result.stdout == b"out\x00putmore"
    assert result.stderr == b"err\nors"


def test_argv_reaches_the_process_unchanged(engine):
    argv = ["python3", "-c", "import sys, json; print(json.dumps(sys.argv[1:]))", "a b", "", "'quoted'", "$HOME", "ünï"]
    result = quinebox.exec(argv)
    assert result.stdout.decode().strip() == '["a b", "", "\'quoted\'", "$HOME", "\\u00fcn\\u00ef"]'


@pytest.mark.parametrize(
    "argv, code",
    [
        (["true"], 0),
        (["false"], 1),
        (["sh", "-c", "exit 3"], 3),
        (["sh", "-c", "exit 255"], 255),
        (["sh", "-c", "kill -9 $$"], 137),
        (["sh", "-c", "kill -TERM $$"], 143),
        (["no-such-command"], 127),
        (["/etc/passwd"], 126),
        (["/world"], 126),
    ],
)
def test_exit_status_passes_through(engine, argv, code):
    assert quinebox.exec(argv).returncode == code


def test_time_limit_kills_a_process_that_ignores_sigterm(engine):
    began = time.monotonic()
    result = quinebox.exec(["sh", "-c", "trap '' TERM; echo started; sleep 60"], timeout=1)
    elapsed = time.monotonic() - began
    assert (result.returncode, result.timed_out) == (124, True)
    assert result.stdout == b"started\n"
    assert elapsed < 5
    assert soon(lambda: boxes_of(engine, result.session)) == []


def test_oom_is_reported_when_the_main_process_dies(engine):
    result = quinebox.exec(["python3", "-c", "x = bytearray(256 << 20)"], grants=["mem:48m"])
    assert (result.returncode, result.oom_killed) == (137, True)


def test_oom_is_reported_even_when_pid_1_survives(engine):
    result = quinebox.exec(["sh", "-c", "python3 -c 'x = bytearray(256 << 20)'; echo survived"], grants=["mem:48m"])
    assert (result.returncode, result.oom_killed, result.stdout) == (0, True, b"survived\n")


def test_no_oom_reported_without_one(engine):
    assert quinebox.exec(["python3", "-c", "x = bytearray(8 << 20)"], grants=["mem:64m"]).oom_killed is False


def test_popen_streams_as_output_is_produced(engine):
    with quinebox.Popen(["sh", "-c", "while read line; do echo got:$line; done"], stdin=quinebox.PIPE, stdout=quinebox.PIPE) as proc:
        proc.stdin.write(b"one\n")
        assert proc.stdout.readline() == b"got:one\n"  # answered before stdin is closed
        proc.stdin.write(b"two\n")
        assert proc.stdout.readline() == b"got:two\n"
        proc.stdin.close()
        assert proc.stdout.read() == b""
    assert proc.returncode == 0


def test_popen_kill_stops_the_box_and_removes_it(engine):
    proc = quinebox.Popen(["sleep", "60"], stdin=quinebox.DEVNULL)
    deadline = time.monotonic() + 10
    while not boxes_of(engine, proc.session) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert boxes_of(engine, proc.session)
    proc.kill()
    assert proc.wait() == 137
    assert soon(lambda: boxes_of(engine, proc.session)) == []


def test_popen_wait_timeout_raises_and_leaves_the_box_running(engine):
    proc = quinebox.Popen(["sleep", "60"], stdin=quinebox.DEVNULL)
    with pytest.raises(subprocess.TimeoutExpired):  # subprocess's, not the builtin TimeoutError (issue 50)
        proc.wait(timeout=0.3)
    assert proc.poll() is None
    proc.kill()
    assert proc.wait() == 137


def test_stdin_eof_reaches_the_box(engine):
    with quinebox.Popen(["wc", "-c"], stdin=quinebox.PIPE, stdout=quinebox.PIPE) as proc:
        proc.stdin.write(b"12345")
        proc.stdin.close()
        assert proc.stdout.read() == b"5\n"


def test_no_box_is_left_after_any_ending(engine):
    sessions = [quinebox.exec(argv, timeout=2).session for argv in (["true"], ["false"], ["sleep", "10"], ["nope"])]
    for session in sessions:
        assert soon(lambda session=session: boxes_of(engine, session)) == []


def test_concurrent_boxes_do_not_mix_their_streams(engine):
    results = {}

    def one(n):
        results[n] = quinebox.exec(["sh", "-c", f"for i in $(seq 200); do echo {n}; done"])

    threads = [threading.Thread(target=one, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for n, result in results.items():
        assert result.stdout == f"{n}\n".encode() * 200


def test_a_quiet_spell_longer_than_the_request_timeout_loses_no_output(engine):
    from quinebox.box.backends.docker.engine import DockerBackend

    impatient = DockerBackend.connect(timeout=1)
    out = []
    proc = quinebox.Popen(["sh", "-c", "sleep 2.5; echo late"], stdin=quinebox.DEVNULL, stdout=out.append, docker=impatient)
    assert proc.wait() == 0
    assert b"".join(out) == b"late\n"


def test_check_raises_called_process_error_as_subprocess_run_does(engine):
    argv = ["sh", "-c", "printf out; printf err >&2; exit 3"]
    with pytest.raises(subprocess.CalledProcessError) as raised:
        quinebox.exec(argv, check=True)
    failed = raised.value
    assert (failed.returncode, failed.cmd, failed.output, failed.stdout, failed.stderr) == (3, tuple(argv), b"out", b"out", b"err")
    assert quinebox.exec(["sh", "-c", "echo fine"], check=True).stdout == b"fine\n"


@pytest.mark.parametrize("backend", ["oci", "docker"])
def test_popen_and_exec_choose_their_backend_by_option_over_the_users_default_and_set_no_environment(engine, backend, monkeypatch):
    monkeypatch.setenv("QUINEBOX_BACKEND", "docker" if backend == "oci" else "oci")  # the user's default: the option wins
    before = dict(os.environ)
    for proc in (quinebox.Popen(["true"], backend=backend, stdin=quinebox.DEVNULL), quinebox.Popen(["true"], quinebox.BoxOptions(backend=backend), stdin=quinebox.DEVNULL)):
        assert proc.wait() == 0
        assert proc.choice.backend == backend, proc.choice.why
    assert quinebox.exec(["sh", "-c", "echo $QUINEBOX_BACKEND"], backend=backend, check=True).stdout == b"\n"
    assert dict(os.environ) == before


@pytest.mark.parametrize(
    "argv",
    [
        ["exec", "--backend", "docker", "--runtime", "runc", "--pull", "never", "--image", "quinebox-test/absent:1", "--", "true"],
        ["run", "--backend", "docker", "--runtime", "runc", "--pull", "never", "--image", "quinebox-test/absent:1", "-m", "script:/nonexistent.yaml", "m"],
        ["resume", "--backend", "docker", "--runtime", "runc", "no-such-session"],
    ],
)
def test_the_cli_hands_its_backend_down_in_the_options_never_through_its_own_environment(argv, monkeypatch):
    from typer.testing import CliRunner

    from quinebox.cli import register
    from quinebox.cli.app import app

    monkeypatch.delenv("QUINEBOX_BACKEND", raising=False)
    monkeypatch.delenv("QUINEBOX_RUNTIME", raising=False)
    register(argv[:1])
    done = CliRunner().invoke(app, argv)
    assert done.exit_code != 0  # nothing to start: an absent image, no such session
    assert ("QUINEBOX_BACKEND" in os.environ, "QUINEBOX_RUNTIME" in os.environ) == (False, False)

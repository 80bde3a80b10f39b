"""`quinebox run` and the session commands, as a user runs them."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from live_boxes import live_boxes, runs_in

from quinebox.agent.store import read_tape

QUINEBOX = str(Path(sys.executable).with_name("quinebox"))
MISSIONS = Path(__file__).resolve().parents[2] / "examples" / "missions"


def qb(*args: str, input: bytes = b"", env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([QUINEBOX, *args], input=input, capture_output=True, timeout=120, env=env)


def script(name: str) -> str:
    return f"script:{MISSIONS / name}"


def test_run_streams_the_deliverable_and_summarizes_with_json(engine):
    done = qb("run", "-m", script("count-lines.yaml"), "--json", "Count the lines", input=b"a\nb\nc\n")
    assert (done.returncode, done.stdout) == (0, b"The material has 3 lines.\n")
    lines = done.stderr.decode().splitlines()
    assert any("turn 1: sh(" in line for line in lines)  # plain progress lines when piped
    summary = json.loads(lines[-1])
    assert summary["termination"] == "exit_success" and summary["turns"] == 3 and summary["tokens"] > 0
    assert {"exit_code", "timed_out", "oom_killed", "duration_s", "session"} <= set(summary)


def test_quiet_leaves_stderr_to_the_agent(engine):
    done = qb("run", "-q", "-m", script("count-lines.yaml"), "Count", input=b"x\n")
    assert (done.returncode, done.stderr) == (0, b"")


def test_a_two_agent_pipeline_gives_exact_bytes(engine):
    log = b"INFO a\nERROR disk\nINFO b\nERROR net\nERROR disk\n"
    pipeline = f"{QUINEBOX} run -q -m {script('errors.yaml')} 'Keep the errors' | {QUINEBOX} run -q -m {script('tally.yaml')} 'Tally them'"
    done = subprocess.run(pipeline, shell=True, input=log, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"      2 ERROR disk\n      1 ERROR net\n"


@pytest.mark.parametrize(
    "args, env_drop, words",
    [
        (["run", "-m", "script:/no/such.yaml", "x"], [], b"model script /no/such.yaml not found"),
        (["run", "-m", script("count-lines.yaml"), "  "], [], b"the mission is empty"),
        (["run", "x"], ["OPENAI_API_KEY", "QUINEBOX_MODEL"], b"no model configured"),
        (["run", "-m", script("count-lines.yaml"), "-g", "ro:/etc", "x"], [], b"never granted"),
        (["show", "no-such-session"], [], b"no session 'no-such-session'"),
        (["replay", "no-such-session"], [], b"no session 'no-such-session'"),
    ],
)
def test_bad_requests_are_one_line_and_exit_125(engine, args, env_drop, words):
    env = {k: v for k, v in os.environ.items() if k not in env_drop}
    done = qb(*args, env=env)
    assert done.returncode == 125, done.stderr
    assert words in done.stderr and done.stderr.count(b"\n") == 1


def test_ls_show_logs_and_replay(engine):
    done = qb("run", "-q", "-m", script("count-lines.yaml"), "--json", "Count the lines", input=b"1\n2\n")
    session = json.loads(done.stderr.decode().splitlines()[-1])["session"]
    assert session in qb("ls").stdout.decode()
    shown = qb("show", session[:8]).stdout.decode()
    assert "mission   Count the lines" in shown and "outcome   exit 0 (exit_success), 3 turns" in shown
    logs = qb("logs", session).stdout.decode().splitlines()
    assert [line.split()[1] for line in logs] == [k["kind"] for k in read_tape(session)]
    same = qb("replay", "-q", session, input=b"1\n2\n")
    assert same.returncode == 0 and b"matches" in same.stderr
    assert same.stdout == b"The material has 2 lines.\n"
    other = qb("replay", "-q", session, input=b"1\n2\n3\n")
    assert other.returncode == 1 and b"diverged" in other.stderr


def test_time_limit_applies_to_agents_too(engine, tmp_path):
    slow = tmp_path / "slow.yaml"
    slow.write_text("turns:\n  - sh: sleep 30\n  - exit: success\n")
    done = qb("run", "-q", "-m", f"script:{slow}", "--timeout", "1", "--json", "be slow")
    assert done.returncode == 124
    assert json.loads(done.stderr.decode().splitlines()[-1])["termination"] == "timeout"


def test_sigkill_of_quinebox_run_leaves_no_box_even_mid_tool_call(engine, tmp_path):
    import time

    slow = tmp_path / "slow.yaml"
    slow.write_text("turns:\n  - exec: start over\n  - sh: sleep 300\n  - exit: success\n")
    proc = subprocess.Popen([QUINEBOX, "run", "-q", "-m", f"script:{slow}", "wait"], stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # until the sleep runs in the second cycle, after an exec
        if any(runs_in(box, b"sleep 300") for box in live_boxes(engine) if box.status == "running"):
            break
        time.sleep(0.1)
    else:
        pytest.fail("the agent never reached its sh call")
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 10
    while live_boxes(engine) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert live_boxes(engine) == []

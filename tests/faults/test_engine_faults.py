"""The Docker engine killed, stopped, frozen or restarted in the middle of work: quinebox never hangs with it.

A running box's command exits 125 with one line within seconds; `map --retries`
finishes every input exactly once after the engine is back; nothing is left for
`gc`; `doctor` says what happened.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from live_boxes import live_boxes


@pytest.fixture(autouse=True)
def docker_backend(monkeypatch):
    """These are the Docker backend's faults: on an OCI runtime a box of an unpacked image asks no engine anything
    (tests/integration/test_oci_backend.py starts one with the engine unreachable)."""
    monkeypatch.setenv("QUINEBOX_BACKEND", "docker")


QUINEBOX = str(Path(sys.executable).with_name("quinebox"))
#: How soon a running box's command must give up on an engine that went away or went quiet.
WITHIN_S = 15


def started(*args: str, env=None) -> subprocess.Popen:
    """`quinebox ARGS` whose box prints `started` first; returned once it has."""
    proc = subprocess.Popen([QUINEBOX, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout.readline() == b"started\n", proc.stderr.read()
    return proc


def ended(proc: subprocess.Popen) -> tuple[int, list[str], float]:
    """(exit status, stderr lines, seconds it took)."""
    began = time.monotonic()
    code = proc.wait(timeout=120)
    return code, proc.stderr.read().decode().splitlines(), time.monotonic() - began


def nothing_left(engine_client) -> None:
    """After the engine is back: no box, no volume, and `gc` has nothing to remove."""
    deadline = time.monotonic() + 30  # the engine removes exited boxes as it catches up
    while live_boxes(engine_client) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert live_boxes(engine_client) == []
    assert engine_client.volumes.list() == []
    gc = subprocess.run([QUINEBOX, "gc"], capture_output=True, timeout=60)
    assert (gc.returncode, gc.stderr.splitlines()[0]) == (0, b"quinebox: removed 0 orphaned boxes"), gc.stderr


def doctor() -> str:
    return subprocess.run([QUINEBOX, "doctor"], capture_output=True, timeout=60).stderr.decode()


@pytest.mark.parametrize(
    "fault, recover, said, remembered",
    [
        ("kill", "start", "quinebox: the Docker engine went away while the box ran (it stopped or restarted); the box is stopped through its lifeline",
         "the engine failed quinebox: box"),
        ("freeze", "thaw", "quinebox: the Docker engine stopped answering while the box ran; the box is stopped through its lifeline",
         "box(es) given up: the Docker engine did not answer a ping in time"),
    ],
    ids=["killed", "frozen"],
)
def test_a_running_exec_exits_125_with_one_line_when_the_engine_fails_and_the_box_is_gone_once_it_is_back(dockerd, engine, fault, recover, said, remembered):
    proc = started("exec", "--", "sh", "-c", "echo started; sleep 60")
    getattr(dockerd, fault)()
    code, lines, took = ended(proc)
    assert (code, len(lines)) == (125, 1), lines
    assert lines[0].startswith(said)
    assert took < WITHIN_S
    getattr(dockerd, recover)()
    nothing_left(engine)
    assert remembered in doctor()


def test_a_running_agent_exits_125_with_one_line_when_the_engine_stops(dockerd, engine, tmp_path):
    (tmp_path / "m.yaml").write_text(json.dumps({"turns": [{"sh": "echo started >&4; sleep 60"}, {"exit": "success"}]}))
    proc = started("run", "-q", "-m", f"script:{tmp_path / 'm.yaml'}", "wait")
    dockerd.stop()
    code, lines, took = ended(proc)
    assert (code, len(lines)) == (125, 1), lines
    assert "the Docker engine went away while the box ran" in lines[0]
    assert took < WITHIN_S
    dockerd.start()
    nothing_left(engine)


def test_a_box_cannot_start_on_a_frozen_engine_and_is_refused_in_time_with_one_line(dockerd, engine):
    dockerd.freeze()
    began = time.monotonic()
    done = subprocess.run([QUINEBOX, "exec", "--", "true"], capture_output=True, timeout=120, env={**os.environ, "QUINEBOX_ENGINE_TIMEOUT": "3"})
    took = time.monotonic() - began
    dockerd.thaw()
    lines = done.stderr.decode().splitlines()
    assert (done.returncode, len(lines)) == (125, 1), lines
    assert lines[0].startswith("quinebox: the Docker engine did not answer") and "it may be wedged" in lines[0]
    assert took < 3 + 10
    nothing_left(engine)


def test_map_with_retries_finishes_every_input_exactly_once_after_the_engine_comes_back(dockerd, engine, tmp_path):
    names = [f"in{i}" for i in range(6)]
    for name in names:
        (tmp_path / name).write_text(name)
    (tmp_path / "copy.yaml").write_text(json.dumps({"turns": [{"sh": "sleep 1; cat <&3 >&4"}, {"exit": "success"}]}))
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [QUINEBOX, "map", "-m", f"script:{tmp_path / 'copy.yaml'}", "copy", *(str(tmp_path / n) for n in names), "--out", str(out), "-P", "2", "--retries", "3"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while not (out / "results.jsonl").exists() or not (out / "results.jsonl").read_text():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    dockerd.kill()
    time.sleep(2)
    dockerd.start()
    assert proc.wait(timeout=180) == 0, proc.stderr.read().decode()[-3000:]
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert sorted(Path(r["input"]).name for r in records) == names  # each input exactly once
    assert all(r["exit_code"] == 0 for r in records)
    assert any(r["attempts"] > 1 for r in records)  # the engine's death was met and retried
    for name in names:
        assert (out / f"{name}.out").read_text() == name
    nothing_left(engine)

"""From inside a real box, hostile frames at the host: the host answers or closes, never crashes, leaks no thread."""

import json
import threading
import time
from pathlib import Path

import pytest

import quinebox

FUZZER = Path(__file__).resolve().parents[1] / "fuzz" / "box_fuzzer.py"


@pytest.fixture
def crashes():
    seen: list = []
    previous = threading.excepthook
    threading.excepthook = lambda args: seen.append(args.exc_value)
    yield seen
    threading.excepthook = previous


def settle(baseline: int, timeout: float = 10) -> int:
    deadline = time.monotonic() + timeout
    while threading.active_count() > baseline and time.monotonic() < deadline:
        time.sleep(0.1)
    return threading.active_count()


def test_an_exec_box_fuzzing_its_socket(engine, crashes):
    baseline = threading.active_count()
    result = quinebox.exec(["python3", "/world/box_fuzzer.py", "1", "300"], world_from=[str(FUZZER)], timeout=300)
    assert (result.returncode, result.stdout) == (0, b"ok 300\n"), result.stderr
    assert crashes == []
    assert settle(baseline) <= baseline
    assert quinebox.exec(["true"]).returncode == 0


def test_an_agent_box_fuzzing_its_session_and_world(engine, crashes, tmp_path):
    script = tmp_path / "m.yaml"
    script.write_text(json.dumps({"turns": [{"sh": "python3 /world/box_fuzzer.py 2 300 >&4"}] + [{"exit": "success"}] * 50}))
    baseline = threading.active_count()
    result = quinebox.run("fuzz the host", model=f"script:{script}", world_from=[str(FUZZER)], timeout=300)
    assert result.stdout == b"ok 300\n", result.stderr
    assert crashes == []
    assert settle(baseline) <= baseline
    assert quinebox.exec(["true"]).returncode == 0

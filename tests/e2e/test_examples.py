"""The examples run as documented, and the terminal view is a terminal view."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
QUINEBOX = str(Path(sys.executable).with_name("quinebox"))


def test_python_api_example(engine):
    done = subprocess.run([sys.executable, str(REPO / "examples" / "python_api.py")], capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout.decode()
    assert "exec: 0 b'HELLO\\n' b'note\\n'" in out
    assert "popen: b'> streamed\\n'" in out
    assert "run: 0 b'The material has 3 lines.\\n' exit_success 3 turns" in out
    assert sorted(line for line in out.splitlines() if line.startswith("map:")) == [
        "map: document 0: The material has 3 lines.",
        "map: document 1: The material has 1 lines.",
        "map: document 2: The material has 2 lines.",
    ]


def test_worlds_example_rolls_back_forks_and_adopts(engine):
    done = subprocess.run(["bash", str(REPO / "examples" / "worlds" / "run.sh")], capture_output=True, timeout=120, env={**os.environ, "PATH": f"{Path(QUINEBOX).parent}:{os.environ['PATH']}"})
    assert done.returncode == 0, done.stderr
    out = done.stdout.decode()
    assert out.startswith('$ quinebox run "Write calc.py, try an edit, undo it"\nadd(2, 3) = 5\n')
    assert "restore_world 1" in out and "-    return a + b\n+    return a - b\n" in out
    assert "# the world as turn 2 found it\ndef add(a, b):\n    return a + b\n" in out
    assert out.endswith("# two children race; the winner is adopted\npolished draft\n")


def test_logs_follow_a_running_session_to_its_end(engine, tmp_path):
    slow = tmp_path / "slow.yaml"
    slow.write_text("turns:\n  - sh: sleep 1.5\n  - exit: success\n")
    run = subprocess.Popen([QUINEBOX, "run", "-q", "--json", "-m", f"script:{slow}", "be slow"], stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 20
    session = None
    while session is None and time.monotonic() < deadline:
        listing = subprocess.run([QUINEBOX, "ls", "-n", "1"], capture_output=True).stdout.decode().splitlines()
        if len(listing) > 1 and "be slow" in listing[1] and "running" in listing[1]:
            session = listing[1].split()[0]
        time.sleep(0.05)
    assert session, "the session never showed up as running"
    follow = subprocess.run([QUINEBOX, "logs", "-f", session], capture_output=True, timeout=30)
    kinds = [line.split()[1] for line in follow.stdout.decode().splitlines()]
    assert kinds[0] == "meta" and kinds[-1] == "outcome" and "tool" in kinds
    assert run.wait(timeout=30) == 0
    assert json.loads(run.stderr.read().decode().splitlines()[-1])["session"] == session


def test_on_a_terminal_progress_is_coloured_and_the_deliverable_is_not(engine):
    mission = f"script:{REPO / 'examples' / 'missions' / 'count-lines.yaml'}"
    command = f"printf 'a\\nb\\n' | {QUINEBOX} run -m {mission} 'Count the lines' 2>&1 >/dev/null"
    done = subprocess.run(["script", "-qec", command, "/dev/null"], capture_output=True, timeout=60)
    assert done.returncode == 0
    assert b"\x1b[" in done.stdout and b"turn 1" in done.stdout  # rich's colours, on the terminal's stderr

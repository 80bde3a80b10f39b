"""The state dir on a full filesystem (a small tmpfs): one clear line and exit 125, no half-written tape or
index, and the next run works once there is space again."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

QUINEBOX = str(Path(sys.executable).with_name("quinebox"))
SIZE = "320m"  # the agent image unpacked for an OCI runtime (about 160 MB; the engine's guest runtime, 35 MB), and room to fill


@pytest.fixture
def small_state(tmp_path, engine):
    if os.getuid() != 0:
        pytest.fail("this test mounts a tmpfs: run it as root, as CI does", pytrace=False)
    state = tmp_path / "state"
    state.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "tmpfs", str(state)], check=True)
    try:
        yield state
    finally:
        subprocess.run(["umount", "-l", str(state)], check=True)


def qb(state: Path, *args: str, cwd=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "QUINEBOX_STATE_DIR": str(state / "quinebox")}
    return subprocess.run([QUINEBOX, *args], capture_output=True, timeout=120, env=env, stdin=subprocess.DEVNULL, cwd=cwd)


def fill(state: Path) -> Path:
    filler = state / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 20))
                f.flush()
        except OSError:
            pass
    return filler


def whole(state: Path) -> None:
    """Every tape parses line by line, and the index answers."""
    for tape in (state / "quinebox" / "sessions").glob("*/tape.jsonl"):
        data = tape.read_bytes()
        assert data == b"" or data.endswith(b"\n"), tape
        for line in data.splitlines():
            json.loads(line)


def test_a_full_state_dir_is_one_clear_line_and_the_next_run_works_once_there_is_space(small_state, tmp_path):
    (tmp_path / "m.yaml").write_text(json.dumps({"turns": [{"sh": "echo done >&4"}, {"exit": "success"}]}))
    mission = ["run", "-q", "-m", f"script:{tmp_path / 'm.yaml'}", "say done"]
    assert qb(small_state, "exec", "--", "true").returncode == 0  # the guest runtime is unpacked once
    filler = fill(small_state)
    for args in (mission, ["exec", "--", "true"]):
        done = qb(small_state, *args)
        lines = done.stderr.decode().splitlines()
        assert (done.returncode, len(lines)) == (125, 1), lines
        assert lines[0].startswith("quinebox: cannot write") and ("No space left on device" in lines[0] or "disk is full" in lines[0]), lines
    whole(small_state)
    assert list((small_state / "quinebox" / "sessions").glob("*/tape.jsonl")) == []  # a session that could not start left nothing
    filler.unlink()
    done = qb(small_state, *mission)
    assert (done.returncode, done.stdout) == (0, b"done\n"), done.stderr
    listed = qb(small_state, "ls")
    assert listed.returncode == 0 and listed.stdout.decode().count("exit_success") == 1
    whole(small_state)


def test_a_box_that_fills_the_state_dir_mid_run_ends_with_one_line_and_a_whole_tape(small_state, tmp_path):
    # To the last page (a write that does not fit leaves what it could not use): the host's next write must fail.
    turns = [{"sh": "head -c 400000000 /dev/zero > big; dd if=/dev/zero of=small bs=4096 2>/dev/null; echo wrote"}, {"sh": "echo after >&4"}, {"exit": "success"}]
    (tmp_path / "m.yaml").write_text(json.dumps({"turns": turns}))
    done = qb(small_state, "run", "-q", "-m", f"script:{tmp_path / 'm.yaml'}", "fill it")
    lines = done.stderr.decode().splitlines()
    assert (done.returncode, len(lines)) == (125, 1), "\n".join(lines)
    assert lines[0].startswith("quinebox: cannot write") and "free some space" in lines[0]
    whole(small_state)
    for world in (small_state / "quinebox" / "sessions").glob("*/world"):
        subprocess.run(["rm", "-rf", str(world)], check=True)  # the user frees space
    (tmp_path / "ok.yaml").write_text(json.dumps({"turns": [{"sh": "echo fine >&4"}, {"exit": "success"}]}))
    again = qb(small_state, "run", "-q", "-m", f"script:{tmp_path / 'ok.yaml'}", "again")
    assert (again.returncode, again.stdout) == (0, b"fine\n"), again.stderr
    whole(small_state)

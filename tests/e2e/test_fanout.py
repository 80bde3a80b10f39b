"""map, batch, the CI review script and the Python API's Box, end to end with scripted models."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from live_boxes import live_boxes

import quinebox

QUINEBOX = str(Path(sys.executable).with_name("quinebox"))
REPO = Path(__file__).resolve().parents[2]
COUNT = f"script:{REPO / 'examples' / 'missions' / 'count-lines.yaml'}"


def qb(*args: str, cwd=None, env=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([QUINEBOX, *args], capture_output=True, cwd=cwd, env=env, timeout=timeout, stdin=subprocess.DEVNULL)


def results(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def write_script(path: Path, *turns: dict) -> str:
    path.write_text(json.dumps({"turns": list(turns)}))
    return f"script:{path}"


def test_map_over_50_inputs(engine, tmp_path):
    inputs = tmp_path / "in"
    inputs.mkdir()
    for i in range(50):
        (inputs / f"doc{i:02d}.txt").write_text("line\n" * (i + 1))
    done = qb("map", "-m", COUNT, "Count the lines", str(inputs / "*.txt"), "--out", str(tmp_path / "out"), "--parallel", "8", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    for i in range(50):
        assert (tmp_path / "out" / f"doc{i:02d}.txt.out").read_bytes() == f"The material has {i + 1} lines.\n".encode()
    records = results(tmp_path / "out")
    assert sorted(r["name"] for r in records) == [f"doc{i:02d}.txt" for i in range(50)]
    assert all(r["exit_code"] == 0 and r["tokens"] > 0 and r["attempts"] == 1 and r["duration_s"] > 0 for r in records)
    assert len({r["session"] for r in records}) == 50
    assert b"\x1b[" not in done.stderr  # no colour without a terminal
    assert json.loads(done.stderr.decode().splitlines()[-1])["done"] == 50


def test_a_maps_outputs_are_made_under_the_callers_umask(engine, tmp_path):
    """Through a command server too: its worker makes them, with the umask the client had, not the server's."""
    (tmp_path / "doc.txt").write_text("line\n")
    out = tmp_path / "out"
    done = subprocess.run([QUINEBOX, "map", "-m", COUNT, "Count the lines", str(tmp_path / "doc.txt"), "--out", str(out)], capture_output=True,
                          timeout=300, stdin=subprocess.DEVNULL, preexec_fn=lambda: os.umask(0o077))
    assert done.returncode == 0, done.stderr[-2000:]
    assert (out / "doc.txt.out").read_bytes() == b"The material has 1 lines.\n"
    made = {str(path.relative_to(tmp_path)): path.stat().st_mode & 0o777 for path in [out, *out.rglob("*")]}
    assert {"out", "out/doc.txt.out", "out/results.jsonl"} <= set(made)
    assert {path: mode for path, mode in made.items() if mode & 0o077} == {}


def test_a_partly_failing_map_exits_non_zero_and_says_which(engine, tmp_path):
    crash = write_script(tmp_path / "m.yaml", {"sh": "if grep -q BAD <&3; then kill -9 $PPID; fi; echo fine >&4"}, {"exit": "success"})
    for name, text in [("a", "ok"), ("b", "BAD"), ("c", "ok"), ("d", "BAD")]:
        (tmp_path / name).write_text(text)
    done = qb("map", "-m", crash, "check", *(str(tmp_path / n) for n in "abcd"), "--out", str(tmp_path / "out"))
    assert done.returncode == 1
    last_lines = done.stderr.decode().splitlines()
    assert any(line.startswith("quinebox: 2 of 4 failed:") and str(tmp_path / "b") in line and str(tmp_path / "d") in line for line in last_lines)
    codes = {Path(r["input"]).name: r["exit_code"] for r in results(tmp_path / "out")}
    assert codes == {"a": 0, "b": 137, "c": 0, "d": 137}


def test_retries_are_for_temporary_failures_only(engine, tmp_path, fake_openai):
    from openai_server import error

    fake_openai.steps = [error(500, "down", retry_after_ms=1)]
    (tmp_path / "x").write_text("x")
    done = qb("map", "temporary", str(tmp_path / "x"), "--out", str(tmp_path / "out"), "--retries", "2")
    [record] = results(tmp_path / "out")
    assert (done.returncode, record["exit_code"], record["attempts"]) == (1, 75, 3)
    assert len(fake_openai.requests) == 3 * 3  # three attempts, each a try and two client retries

    refuse = write_script(tmp_path / "no.yaml", {"exit": {"status": "failure", "reason": "no"}})
    done = qb("map", "-m", refuse, "own failure", str(tmp_path / "x"), "--out", str(tmp_path / "out2"), "--retries", "2")
    [record] = results(tmp_path / "out2")
    assert (done.returncode, record["exit_code"], record["attempts"]) == (1, 1, 1)


def test_fail_fast_starts_nothing_after_the_first_failure(engine, tmp_path):
    refuse = write_script(tmp_path / "no.yaml", {"exit": {"status": "failure", "reason": "no"}})
    for i in range(5):
        (tmp_path / f"i{i}").write_text("x")
    done = qb("map", "-m", refuse, "x", *(str(tmp_path / f"i{i}") for i in range(5)), "--out", str(tmp_path / "out"), "-P", "1", "--fail-fast")
    assert done.returncode == 1
    assert len(results(tmp_path / "out")) == 1


def test_an_interrupted_map_resumes_without_redoing_finished_inputs(engine, tmp_path):
    slow = write_script(tmp_path / "slow.yaml", {"sh": "sleep 0.4; cat <&3 >&4"}, {"exit": "success"})
    names = [f"n{i}" for i in range(6)]
    for name in names:
        (tmp_path / name).write_text(name)
    args = ["map", "-m", slow, "copy", *(str(tmp_path / n) for n in names), "--out", str(tmp_path / "out"), "-P", "1"]
    proc = subprocess.Popen([QUINEBOX, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not ((tmp_path / "out" / "results.jsonl").exists() and len(results(tmp_path / "out")) >= 2):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 130
    first = results(tmp_path / "out")
    assert 2 <= len(first) < 6
    assert live_boxes(engine) == []
    done = qb(*args, "--resume")
    assert done.returncode == 0, done.stderr
    second = results(tmp_path / "out")
    assert second[: len(first)] == first  # kept, not redone
    assert sorted(Path(r["input"]).name for r in second) == names  # each input exactly once
    for name in names:
        assert (tmp_path / "out" / f"{name}.out").read_text() == name


def test_batch_runs_jobs_with_their_own_models_and_materials(engine, tmp_path):
    (tmp_path / "notes.txt").write_text("a\nb\n")
    approve = REPO / "examples" / "missions" / "review-approve.yaml"
    jobs = {
        "defaults": {"mission": "Count the lines", "model": COUNT},
        "jobs": [
            {"name": "from-file", "material": "notes.txt"},
            {"name": "inline", "input": "x\ny\nz\n"},
            {"name": "review", "mission": "Review", "model": f"script:{approve}", "input": "+a\n-b\n"},
        ],
    }
    (tmp_path / "jobs.yaml").write_text(json.dumps(jobs))
    done = qb("batch", str(tmp_path / "jobs.yaml"), "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "from-file.out").read_text() == "The material has 2 lines.\n"
    assert (tmp_path / "out" / "inline.out").read_text() == "The material has 3 lines.\n"
    assert (tmp_path / "out" / "review.out").read_text() == "## Review\n\n2 changed lines; nothing blocking.\n"
    assert len(results(tmp_path / "out")) == 3


def test_bad_batch_files_and_inputs_are_refused_before_anything_runs(engine, tmp_path):
    (tmp_path / "jobs.yaml").write_text("jobs: [{input: x}]")
    done = qb("batch", str(tmp_path / "jobs.yaml"), "--out", str(tmp_path / "out"))
    assert done.returncode == 125 and b"needs a mission" in done.stderr
    done = qb("map", "-m", COUNT, "x", str(tmp_path / "nothing-*.txt"), "--out", str(tmp_path / "out"))
    assert done.returncode == 125 and b"no input matches" in done.stderr
    assert not (tmp_path / "out").exists()


def test_the_ci_review_script_passes_and_fails_with_the_review(engine, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*a: str) -> None:
        subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *a], cwd=repo, check=True, capture_output=True)

    git("init", "-q", "-b", "main")
    (repo / "app.py").write_text("print('hi')\n")
    git("add", "."), git("commit", "-qm", "base")
    git("checkout", "-qb", "change")
    (repo / "app.py").write_text("print('hi')\n# TODO: handle errors\n")
    git("commit", "-qam", "change")
    env = {**os.environ, "PATH": f"{Path(QUINEBOX).parent}:{os.environ['PATH']}"}
    script = str(REPO / "examples" / "ci" / "review.sh")
    for model, code, words in [("review-approve.yaml", 0, "review: approved"), ("review-reject.yaml", 1, "review: changes requested")]:
        env["QUINEBOX_REVIEW_MODEL"] = f"script:{REPO / 'examples' / 'missions' / model}"
        done = subprocess.run(["bash", script, "main"], cwd=repo, env=env, capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
        assert done.returncode == code, done.stderr
        assert words in done.stderr.decode()
        assert (repo / "review.md").read_text().startswith("## Review")
    assert "- blocking: 7:+# TODO: handle errors" in (repo / "review.md").read_text()  # line 7 of the diff


def test_the_python_api_and_the_cli_give_the_same_results(engine, tmp_path):
    material = b"1\n2\n3\n4\n"
    api = quinebox.run("Count the lines", input=material, model=COUNT)
    cli = subprocess.run([QUINEBOX, "run", "-q", "-m", COUNT, "Count the lines"], input=material, capture_output=True, timeout=60)
    assert (api.returncode, api.stdout, api.stderr) == (cli.returncode, cli.stdout, cli.stderr) == (0, b"The material has 4 lines.\n", b"")

    box = quinebox.Runner(model=COUNT, grants=["mem:256m"])

    async def gather():
        return [pair async for pair in box.map("Count the lines", [b"a\n" * n for n in range(1, 7)], parallel=3)]

    pairs = asyncio.run(gather())
    assert sorted(index for index, _ in pairs) == list(range(6))
    for index, result in pairs:
        assert result.stdout == f"The material has {index + 1} lines.\n".encode()
    assert asyncio.run(box.spawn("Count the lines", input=b"x\n")).stdout == b"The material has 1 lines.\n"

"""A real `quinebox map`, then one SIGKILLed mid-way, as the view's reader of run records sees them."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from commands import wait_for
from live_boxes import live_boxes

from quinebox.agent.store import Index
from quinebox.tree.runs import ATTEMPTS, runs_dir
from quinebox.view import runs_view

QUINEBOX = str(Path(sys.executable).with_name("quinebox"))
REPO = Path(__file__).resolve().parents[2]
COUNT = f"script:{REPO / 'examples' / 'missions' / 'count-lines.yaml'}"


def run_of(out: Path) -> dict:
    """The one recorded run that wrote to `out` (the state dir is the test session's, shared with other tests)."""
    [found] = [row for row in runs_view.runs() if row["out"] == str(out.resolve())]
    return runs_view.run(found["id"])


def test_a_map_is_recorded_with_each_input_its_session_exit_and_output(engine, tmp_path):
    for n in (1, 2, 3):
        (tmp_path / f"doc{n}.txt").write_text("line\n" * n)
    out = tmp_path / "out"
    done = subprocess.run([QUINEBOX, "map", "-m", COUNT, "Count the lines", str(tmp_path / "doc*.txt"), "--out", str(out)],
                          capture_output=True, timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-2000:]
    run = run_of(out)
    assert {k: run[k] for k in ("kind", "mission", "state", "exit_code", "total", "done", "failed", "running")} == {
        "kind": "map", "mission": "Count the lines", "state": "done", "exit_code": 0, "total": 3, "done": 3, "failed": 0, "running": 0}
    assert run["started"] <= run["ended"] <= time.time()
    results = {r["name"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    index = Index()
    try:
        for n, row in enumerate(run["inputs"], 1):
            assert (row["name"], row["state"], row["exit_code"], row["attempts"]) == (f"doc{n}.txt", "done", 0, 1)
            assert row["output"] == f"The material has {n} lines.\n" and row["output_bytes"] == len(row["output"])
            assert row["session"] == results[row["name"]]["session"] and index.get(row["session"]) is not None
            assert row["tokens"] > 0 and row["duration_s"] > 0 and row["termination"] == results[row["name"]]["termination"]
    finally:
        index.close()
    # Each attempt was noted with its session as it started.
    attempts = [json.loads(line) for line in (runs_dir() / run["id"] / ATTEMPTS).read_text().splitlines()]
    assert sorted((a["name"], a["session"]) for a in attempts) == sorted((r["name"], r["session"]) for r in run["inputs"])


def test_a_map_killed_mid_way_shows_as_killed_with_its_unfinished_inputs_not_done(engine, tmp_path):
    (tmp_path / "slow.yaml").write_text(json.dumps({"turns": [{"sh": "m=$(cat <&3); [ \"$m\" = k1 ] || sleep 60; printf %s \"$m\" >&4"}, {"exit": "success"}]}))
    names = ["k1", "k2", "k3"]
    for name in names:
        (tmp_path / name).write_text(name)
    out = tmp_path / "out"
    args = [QUINEBOX, "map", "-m", f"script:{tmp_path / 'slow.yaml'}", "copy", *(str(tmp_path / n) for n in names), "--out", str(out), "-P", "1"]
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # Live: the second input runs (its session known) once the first has finished; it would take a minute.
        live = wait_for(lambda: (r := _maybe_run(out)) and [i["state"] for i in r["inputs"]] == ["done", "running", "queued"] and r, timeout=120, every=0.05, what="k2 running")
        assert live["state"] == "running" and live["inputs"][1]["session"] and (live["done"], live["running"]) == (1, 1)
        stamp = runs_view.run_stamp()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert runs_view.run_stamp() != stamp  # nothing on disk changed, but its owner died
    run = run_of(out)
    assert (run["state"], run["ended"], run["exit_code"]) == ("killed", None, None)
    states = {row["name"]: (row["state"], row["termination"]) for row in run["inputs"]}
    assert states["k1"] == ("done", "exit_success") and run["inputs"][0]["output"] == "k1"
    assert states["k2"] == ("failed", "killed") and states["k3"] == ("queued", None)
    assert (run["done"], run["failed"], run["running"]) == (1, 1, 0)
    [row] = [r for r in runs_view.runs() if r["id"] == run["id"]]
    assert row["state"] == "killed"
    # What the killed map left running is its gc's.
    assert subprocess.run([QUINEBOX, "gc"], capture_output=True, timeout=60).returncode == 0
    wait_for(lambda: live_boxes(engine) == [], timeout=30, what="the killed map's boxes gone")


def _maybe_run(out: Path) -> dict | None:
    found = [row for row in runs_view.runs() if row["out"] == str(out.resolve())]
    return runs_view.run(found[0]["id"]) if found else None

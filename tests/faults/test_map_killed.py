"""SIGKILL of `quinebox map` at random moments: `--resume` completes every input exactly once, one line each."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from live_boxes import live_boxes

from quinebox.box.spec import DEFAULT_IMAGE

QUINEBOX = str(Path(sys.executable).with_name("quinebox"))
KILLS = 20


def test_map_killed_20_times_at_random_then_resumed_runs_every_input_exactly_once(engine, tmp_path):
    seed = int(os.environ.get("QUINEBOX_KILL_SEED", time.time_ns() % 10**6))
    chance = random.Random(seed)
    names = [f"in{i:02d}" for i in range(10)]
    for name in names:
        (tmp_path / name).write_text(name * 3)
    (tmp_path / "copy.yaml").write_text(json.dumps({"turns": [{"sh": "sleep 0.3; cat <&3 >&4"}, {"exit": "success"}]}))
    out = tmp_path / "out"
    args = [QUINEBOX, "map", "-m", f"script:{tmp_path / 'copy.yaml'}", "copy", *(str(tmp_path / n) for n in names), "--out", str(out), "-P", "3", "--resume"]
    for _ in range(KILLS):
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(chance.uniform(0, 2.0))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    done = subprocess.run(args, capture_output=True, timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"seed {seed}: {done.stderr.decode()[-2000:]}"
    lines = (out / "results.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert sorted(Path(r["input"]).name for r in records) == names, f"seed {seed}"  # each input exactly once
    assert all(r["exit_code"] == 0 for r in records)
    for name in names:
        assert (out / f"{name}.out").read_text() == name * 3
    gc = subprocess.run([QUINEBOX, "gc"], capture_output=True, timeout=60)  # boxes created but never started by a killed map
    assert gc.returncode == 0
    deadline = time.monotonic() + 30
    while live_boxes(engine) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert live_boxes(engine) == []
    # Nor the containers a killed map had created to copy the guest runtime out of the image.
    assert engine.api.containers(all=True, filters={"ancestor": DEFAULT_IMAGE, "status": "created"}) == []

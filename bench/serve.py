"""`quinebox exec -- true` through the command server, side by side with the cold CLI and `docker run`, in one run.

    .venv/bin/python bench/serve.py [--runs 20]

Three commands, interleaved (the order rotating), each run `--runs` times:
  - `quinebox exec -- true` with a server answering (the thin client's path)
  - the same with QUINEBOX_SERVE=off (the CLI as it starts cold)
  - `docker run --rm --network none IMAGE true`
Medians are quoted, with the ratios; and the server's RSS at the end.
The issue's target with a warm pool (not built yet) is ≤ 0.35× docker run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from quinebox.box.spec import DEFAULT_IMAGE

QUINEBOX = str(Path(sys.executable).with_name("quinebox"))
DOCKER = shutil.which("docker") or "docker"


def timed(argv: list[str], env: dict[str, str]) -> float:
    began = time.perf_counter()
    done = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True)
    took = time.perf_counter() - began
    assert done.returncode == 0, done.stderr
    return took


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    runs = parser.parse_args().runs
    env = {**os.environ, "QUINEBOX_STATE_DIR": tempfile.mkdtemp(prefix="quinebox-bench-serve-")}
    subprocess.run([QUINEBOX, "serve", "--background"], env=env, check=True, capture_output=True)
    try:
        sides = {
            "server": ([QUINEBOX, "exec", "--", "true"], env),
            "cold": ([QUINEBOX, "exec", "--", "true"], {**env, "QUINEBOX_SERVE": "off"}),
            "docker": ([DOCKER, "run", "--rm", "--network", "none", DEFAULT_IMAGE, "true"], env),
        }
        for argv, side_env in sides.values():
            timed(argv, side_env)  # warm: image, runtime, page cache
        times: dict[str, list[float]] = {name: [] for name in sides}
        order = list(sides)
        for index in range(runs):
            for name in order[index % 3 :] + order[: index % 3]:
                times[name].append(timed(*sides[name]))
        status = subprocess.run([QUINEBOX, "serve", "status"], env=env, capture_output=True, text=True).stdout
        pid = int(status.split("pid ")[1].split(",")[0])
        median = {name: statistics.median(values) * 1000 for name, values in times.items()}
        print(f"quinebox exec -- true, through the server  {median['server']:7.1f} ms")
        print(f"quinebox exec -- true, cold CLI            {median['cold']:7.1f} ms")
        print(f"docker run --rm --network none IMAGE true  {median['docker']:7.1f} ms   ({runs} runs each, interleaved, medians)")
        print(f"server / docker run {median['server'] / median['docker']:.2f}   cold / docker run {median['cold'] / median['docker']:.2f}   "
              f"server / cold {median['server'] / median['cold']:.2f}   saved per command {median['cold'] - median['server']:.0f} ms")
        print(f"server RSS {rss_mb(pid):.0f} MB")
    finally:
        subprocess.run([QUINEBOX, "serve", "stop"], env=env, capture_output=True)


if __name__ == "__main__":
    main()

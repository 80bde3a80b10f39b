"""The command server and its warm pool, side by side with their baselines, in one run.

    .venv/bin/python bench/serve.py [--runs 20] [--pool 4]

Interleaved (the order rotating each round), each `--runs` times; medians quoted:

1. `quinebox exec -- true` through the server with a warm pool, the same with
   the pool off (QUINEBOX_POOL=off: the server's worker starts the box cold),
   the cold CLI (QUINEBOX_SERVE=off), and `docker run --rm --network none
   IMAGE true`.                                      target: warm ≤ 0.35× docker run
2. `quinebox.exec(["true"])` in this process with the server's pool answering
   vs docker-py's `containers.run(IMAGE, "true", remove=True, network_mode="none")`.
                                                     target: ≤ 0.25×
3. a one-turn mission (`quinebox run`, scripted model) vs `exec -- true`, both
   through the server.                               target: ≤ +100 ms
4. the server's and its pool keeper's RSS with a pool of 8 and 16 boxes running.
                                                     target: ≤ 200 MB

Between rounds the pool is given time to refill, so that each round measures a
warm claim (the claim latency, hits and misses are printed from `serve status`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import docker

from quinebox.box.spec import DEFAULT_IMAGE

QUINEBOX = str(Path(sys.executable).with_name("quinebox"))
DOCKER = shutil.which("docker") or "docker"


def command(argv: list[str], env: dict[str, str]) -> Callable[[], None]:
    def run() -> None:
        done = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True)
        assert done.returncode == 0, done.stderr
    return run


def timed(run: Callable[[], None]) -> float:
    began = time.perf_counter()
    run()
    return time.perf_counter() - began


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def status(env: dict[str, str]) -> dict:
    return json.loads(subprocess.run([QUINEBOX, "serve", "status", "--json"], env=env, capture_output=True, check=True).stdout)


def warm(env: dict[str, str], size: int, timeout: float = 60.0) -> None:
    """Until every shape the pool knows has `size` warm boxes (a round then measures a warm claim)."""
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        shapes = status(env)["pool"]["shapes"]
        if shapes and all(shape["warm"] >= size for shape in shapes):
            return
        time.sleep(0.1)
    raise SystemExit("the pool did not refill in time")


def compare(sides: dict[str, Callable[[], None]], runs: int, between: Callable[[], None]) -> dict[str, float]:
    """Each side `runs` times, interleaved with the order rotating; the medians in ms."""
    for run in sides.values():
        run()  # warm: image, runtime, page cache, the pool's shape
    between()
    times: dict[str, list[float]] = {name: [] for name in sides}
    order = list(sides)
    for index in range(runs):
        shift = index % len(order)
        for name in order[shift:] + order[:shift]:
            times[name].append(timed(sides[name]))
            between()
    return {name: statistics.median(values) * 1000 for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--pool", type=int, default=4)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="quinebox-bench-serve-"))
    env = {**os.environ, "QUINEBOX_STATE_DIR": str(work / "state"), "XDG_CONFIG_HOME": str(work / "config")}
    env.pop("QUINEBOX_POOL", None)
    env["QUINEBOX_SERVE"] = "manual"
    os.environ.update(env)  # the API's side below claims from the same pool
    script = work / "one-turn.yaml"
    script.write_text(json.dumps({"turns": [{"exit": "success"}]}))
    subprocess.run([QUINEBOX, "serve", "--background", "--pool", str(args.pool)], env=env, check=True, capture_output=True)
    refill = lambda: warm(env, args.pool)  # noqa: E731
    try:
        import quinebox

        engine = docker.from_env()
        first = compare(
            {
                "warm": command([QUINEBOX, "exec", "--", "true"], env),
                "server, no pool": command([QUINEBOX, "exec", "--", "true"], {**env, "QUINEBOX_POOL": "off"}),
                "cold CLI": command([QUINEBOX, "exec", "--", "true"], {**env, "QUINEBOX_SERVE": "off"}),
                "docker run": command([DOCKER, "run", "--rm", "--network", "none", DEFAULT_IMAGE, "true"], env),
            },
            args.runs, refill,
        )
        print(f"1. exec -- true, {args.runs} runs each, interleaved, medians")
        for name, ms in first.items():
            print(f"   {name:<40} {ms:7.1f} ms")
        print(f"   warm / docker run {first['warm'] / first['docker run']:.2f} (target ≤ 0.35)   cold CLI / docker run "
              f"{first['cold CLI'] / first['docker run']:.2f}   server, no pool / docker run {first['server, no pool'] / first['docker run']:.2f}")

        def api() -> None:
            assert quinebox.exec(["true"]).returncode == 0

        def docker_py() -> None:
            engine.containers.run(DEFAULT_IMAGE, "true", remove=True, network_mode="none")

        second = compare({"quinebox.exec, pool": api, "docker-py containers.run": docker_py}, args.runs, refill)
        print(f"\n2. the Python API, {args.runs} runs each, interleaved, medians")
        for name, ms in second.items():
            print(f"   {name:<40} {ms:7.1f} ms")
        print(f"   quinebox.exec / containers.run {second['quinebox.exec, pool'] / second['docker-py containers.run']:.2f} (target ≤ 0.25)")

        third = compare(
            {
                "run (one-turn mission)": command([QUINEBOX, "run", "-q", "-m", f"script:{script}", "finish at once"], env),
                "exec -- true": command([QUINEBOX, "exec", "--", "true"], env),
            },
            args.runs, refill,
        )
        print(f"\n3. through the server, {args.runs} runs each, interleaved, medians")
        for name, ms in third.items():
            print(f"   {name:<40} {ms:7.1f} ms")
        print(f"   a one-turn mission costs {third['run (one-turn mission)'] - third['exec -- true']:+.0f} ms over exec -- true (target ≤ +100)")

        said = status(env)
        print("\n   pool:", ", ".join(f"shape {s['shape']}: {s['hits']} hits, {s['misses']} misses, claim p50/p95/p99 "
                                    f"{s['p50_ms']:.2f}/{s['p95_ms']:.2f}/{s['p99_ms']:.2f} ms" for s in said["pool"]["shapes"] if s["hits"]))
        subprocess.run([QUINEBOX, "serve", "stop"], env=env, capture_output=True)
        time.sleep(1)
        subprocess.run([QUINEBOX, "serve", "--background", "--pool", "8"], env=env, check=True, capture_output=True)
        warm(env, 8)
        running = [subprocess.Popen([QUINEBOX, "exec", "--", "sleep", "30"], env=env, stdin=subprocess.DEVNULL) for _ in range(16)]
        time.sleep(5)
        warm(env, 8)
        said = status(env)
        server, keeper = rss_mb(said["pid"]), rss_mb(said["pool"]["pid"])
        print(f"\n4. with a pool of 8 and 16 boxes running: server RSS {server:.0f} MB + pool keeper RSS {keeper:.0f} MB = "
              f"{server + keeper:.0f} MB (target ≤ 200)")
        for proc in running:
            proc.kill()
            proc.wait()
    finally:
        subprocess.run([QUINEBOX, "serve", "stop"], env=env, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

"""What one box costs, side by side with plain Docker, in one run.

    .venv/bin/python bench/spawn.py [--runs 20] [--stream-mib 1024] [--stream-runs 3] [--only api|cli|stream|images]

1. In one Python process: quinebox.exec(["true"]) vs docker-py's
   containers.run(image, "true", network_mode="none", remove=True).  target ≤ 1.15
2. From the shell: `quinebox exec -- true` vs `docker run --rm --network none IMAGE true`.
   target ≤ 1.6, and the CLI's own start-up (interpreter + imports) < 150 ms
3. Streaming: `quinebox exec -- cat` vs `docker run -i --rm --network none IMAGE cat`
   over the same bytes. target: throughput ratio ≥ 0.8, quinebox peak RSS ≤ 100 MB
4. Any image: `quinebox exec --image <an image without Python> -- true` vs the same with
   the agent image. target: the injected runtime costs ≤ 10 ms more per box

Pairs are interleaved so drift in the machine hits both sides alike; medians are quoted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import docker
from measure import run_child

import quinebox
from quinebox.box.spec import DEFAULT_IMAGE

QUINEBOX = str(Path(sys.executable).with_name("quinebox"))
DOCKER = shutil.which("docker") or "docker"


def timed(fn) -> float:
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


def median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


def report(name: str, ours: list[float], theirs: list[float], target: str) -> float:
    ratio = statistics.median(ours) / statistics.median(theirs)
    print(f"{name:<44} quinebox {median_ms(ours):7.1f} ms   docker {median_ms(theirs):7.1f} ms   ratio {ratio:.3f}  (target {target})")
    return ratio


def bench_api(client: docker.DockerClient, image: str, runs: int) -> float:
    ours, theirs = [], []
    for _ in range(runs):
        ours.append(timed(lambda: quinebox.exec(["true"], image=image)))
        theirs.append(timed(lambda: client.containers.run(image, "true", network_mode="none", remove=True)))
    return report("API: exec(['true']) vs containers.run", ours, theirs, "≤ 1.15")


def bench_cli(image: str, runs: int) -> tuple[float, float]:
    ours, theirs, startup = [], [], []
    unreachable = {**os.environ, "DOCKER_HOST": "unix:///nonexistent/quinebox-bench.sock"}
    for _ in range(runs):
        ours.append(run_child([QUINEBOX, "exec", "--image", image, "--", "true"]).seconds)
        theirs.append(run_child([DOCKER, "run", "--rm", "--network", "none", image, "true"]).seconds)
        # Everything but the engine: interpreter, imports, parsing, grants, policy; then exit 125.
        startup.append(run_child([QUINEBOX, "exec", "--image", image, "--", "true"], env=unreachable, check=False).seconds)
    ratio = report("CLI: quinebox exec -- true vs docker run --rm", ours, theirs, "≤ 1.6")
    print(f"{'CLI start-up (interpreter + imports + parse)':<44} {median_ms(startup):7.1f} ms  (target < 150 ms)")
    return ratio, median_ms(startup)


def bench_stream(image: str, mib: int, runs: int, with_quiet_baseline: bool) -> tuple[float, float]:
    with tempfile.NamedTemporaryFile(prefix="quinebox-bench-") as blob:
        chunk = os.urandom(1 << 20)
        for _ in range(mib):
            blob.write(chunk)
        blob.flush()
        sides = {
            "quinebox": [QUINEBOX, "exec", "--image", image, "--", "cat"],
            "docker": [DOCKER, "run", "-i", "--rm", "--network", "none", image, "cat"],
        }
        if with_quiet_baseline:
            sides["docker --log-driver none"] = [DOCKER, "run", "-i", "--rm", "--network", "none", "--log-driver", "none", image, "cat"]
        times: dict[str, list[float]] = {name: [] for name in sides}
        rss: list[int] = []
        for _ in range(runs):
            for name, argv in sides.items():
                with open(blob.name, "rb") as f:
                    measured = run_child(argv, stdin=f)
                times[name].append(measured.seconds)
                if name == "quinebox":
                    rss.append(measured.peak_kib)
    rate = {name: mib / statistics.median(values) for name, values in times.items()}
    ratio = rate["quinebox"] / rate["docker"]
    print(f"{'stream ' + str(mib) + ' MiB through cat':<44} quinebox {rate['quinebox']:7.1f} MiB/s   docker {rate['docker']:7.1f} MiB/s   ratio {ratio:.2f}  (target ≥ 0.8)")
    if with_quiet_baseline:
        quiet = rate["docker --log-driver none"]
        print(f"{'  same, docker without its json log':<44} docker {quiet:7.1f} MiB/s   ratio {rate['quinebox'] / quiet:.2f}")
    peak_mb = max(rss) / 1024
    print(f"{'quinebox peak RSS while streaming':<44} {peak_mb:7.1f} MB  (target ≤ 100 MB)")
    return ratio, peak_mb


def bench_images(image: str, runs: int) -> float:
    """The image without Python is tests/images.py's: the agent image with Python and /.quinebox removed."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from images import NOPYTHON, build_all

    build_all(docker.from_env())
    sides = {"agent": [QUINEBOX, "exec", "--image", image, "--", "true"], "nopython": [QUINEBOX, "exec", "--image", NOPYTHON.name, "--", "true"]}
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(runs):
        for name, argv in sides.items():
            times[name].append(run_child(argv).seconds)
    # Each pair ran back to back, so the median of the pairs' differences cancels the machine's drift.
    extra = median_ms([ours - theirs for ours, theirs in zip(times["nopython"], times["agent"])])
    print(f"{'CLI: exec --image <no Python> -- true':<44} no-python {median_ms(times['nopython']):7.1f} ms   agent image {median_ms(times['agent']):7.1f} ms   "
          f"extra (median of pairs) {extra:+.1f} ms  (target ≤ 10 ms)")
    return extra


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--stream-mib", type=int, default=1024)
    parser.add_argument("--stream-runs", type=int, default=3)
    parser.add_argument("--image", default=DEFAULT_IMAGE)
    parser.add_argument("--quiet-baseline", action="store_true", help="also compare with docker run --log-driver none")
    parser.add_argument("--only", choices=("api", "cli", "stream", "images"), help="run one comparison")
    args = parser.parse_args()
    client = docker.from_env()
    client.containers.run(args.image, "true", network_mode="none", remove=True)  # warm the image cache
    quinebox.exec(["true"], image=args.image)
    print(f"image {args.image}, {args.runs} runs per side, medians\n")
    met = True
    if args.only in (None, "api"):
        met &= bench_api(client, args.image, args.runs) <= 1.15
    if args.only in (None, "cli"):
        cli_ratio, startup_ms = bench_cli(args.image, args.runs)
        met &= cli_ratio <= 1.6 and startup_ms < 150
    if args.only in (None, "stream"):
        stream_ratio, peak_mb = bench_stream(args.image, args.stream_mib, args.stream_runs, args.quiet_baseline)
        met &= stream_ratio >= 0.8 and peak_mb <= 100
    if args.only in (None, "images"):
        met &= bench_images(args.image, args.runs) <= 10
    print("\nall targets met" if met else "\nSOME TARGETS MISSED")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())

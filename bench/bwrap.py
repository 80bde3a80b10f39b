"""The bubblewrap backend's numbers (issue 51), side by side with `docker run` and runc, in one run.

    .venv/bin/python bench/bwrap.py [--runs 20] [--rounds 3] [--boxes 200] [--quick] [--backend bwrap]

Interleaved (the order rotating each round); medians; the machine's core count printed. Each quinebox side names its
backend (QUINEBOX_BACKEND=bwrap, or oci with QUINEBOX_RUNTIME=runc): none depends on what `auto` picks here.

1. `quinebox exec -- true` through `quinebox serve`: bwrap (no warm pool: each box is cold, started by the server's
   worker), runc (a claimed warm box), the cold CLI on each, and `docker run --rm --network none IMAGE true`.
                                                     target: bwrap through serve ≤ 0.08× docker run
   bwrap's cold box through serve beside runc's warm claim answers "the warm pool, or none if cold is cheaper".
2. The first call, which starts the server (a fresh state dir, QUINEBOX_SERVE=auto), on bwrap.
                                                     target: ≤ 0.9× docker run
3. `--boxes` × `quinebox exec -- true` at `xargs -P8` through serve (bwrap; runc beside) vs as many `docker run` at -P8.
                                                     target: ≥ 8× docker run's boxes/s (bar ≥ 5×)
4. `quinebox.exec(["true"])` in this process on bwrap (the server up) vs docker-py's `containers.run(IMAGE, "true",
   remove=True, network_mode="none")`.               target: ≤ 0.03×

The rest of the issue's numbers have benches of their own, each run on bwrap by its environment:

    QUINEBOX_BACKEND=bwrap .venv/bin/python bench/fanout.py --missions 200 --parallel 16 --serve 4   # ≥ 4× xargs -P16 docker run
    QUINEBOX_BACKEND=bwrap .venv/bin/python bench/tree.py --serve 4                                 # the 36-session tree ≤ 2× its critical path
    .venv/bin/python bench/serve_cpu.py --backend bwrap --pool 0                                   # a served exec's CPU, with its parts

Everything runs in a state dir of its own (removed at the end); a command that fails or overruns stops the benchmark
with its last lines (a figure from a failed run would be a lie; those made until then are printed).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from autostart import answering, no_server, until
from oci import DOCKER, IN_PROCESS, QUINEBOX, Failed, Measured, Row, command, compare, deadline, docker_py, median_s, stopped, verdicts

from quinebox.box.backends.exec_cgroups import local_waiting_moves
from quinebox.box.spec import DEFAULT_IMAGE

PARALLEL = 8


def served_up(env: dict[str, str], timeout: float = 60.0) -> None:
    """`quinebox serve --background` on `env`'s state dir (it returns once the server answers)."""
    started = subprocess.run([QUINEBOX, "serve", "--background"], env=env, capture_output=True, timeout=timeout)
    if started.returncode != 0:
        raise Failed(f"quinebox serve did not start: {started.stderr.decode(errors='replace')[-400:]}")


def serve_stop(env: dict[str, str]) -> None:
    subprocess.run([QUINEBOX, "serve", "stop"], env=env, capture_output=True, timeout=120)


def first_call(env: dict[str, str]) -> Callable[[], Measured]:
    """`exec -- true` in a state dir no server serves (QUINEBOX_SERVE=auto: this call starts one), as autostart.py
    times it: the server stopped and waited gone before, the one it started waited for after (untimed). The state dir
    is kept across runs: its image is unpacked once, by the warm-up run, as a user's is."""

    def call() -> Measured:
        no_server(env)
        measured = command([QUINEBOX, "exec", "--", "true"], env)()
        until(lambda: answering(env), "the server the first call started, answering")
        return measured

    return call


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, help="runs of each single-box side (default 20; --quick 5)")
    parser.add_argument("--rounds", type=int, help="rounds of the throughput batches (default 3; --quick 1)")
    parser.add_argument("--boxes", type=int, help="boxes per throughput batch (default 200; --quick 40)")
    parser.add_argument("--backend", default="bwrap", help="the backend measured against docker run and runc (default bwrap)")
    parser.add_argument("--quick", action="store_true", help="5 runs, 1 round, 40 boxes")
    args = parser.parse_args()
    runs = args.runs or (5 if args.quick else 20)
    rounds = args.rounds or (1 if args.quick else 3)
    boxes = args.boxes or (40 if args.quick else 200)
    name = args.backend

    work = Path(tempfile.mkdtemp(prefix="quinebox-bench-bwrap-"))
    base = {**os.environ, "XDG_CONFIG_HOME": str(work / "config")}
    for key in ("QUINEBOX_POOL", "QUINEBOX_BACKEND", "QUINEBOX_RUNTIME", "PYTHONDONTWRITEBYTECODE"):  # the client from cached bytecode, as installed
        base.pop(key, None)
    cold = {**base, "QUINEBOX_STATE_DIR": str(work / "state"), "QUINEBOX_SERVE": "off", "QUINEBOX_BACKEND": name}
    runc_cold = {**cold, "QUINEBOX_BACKEND": "oci", "QUINEBOX_RUNTIME": "runc"}
    # One server per backend, each in a state dir of its own: a server's pool keeps the default shape of the backend
    # its environment chose, so runc's warm boxes and bwrap's cold ones never share a pool.
    ours = {**cold, "QUINEBOX_STATE_DIR": str(work / "served"), "QUINEBOX_SERVE": "manual"}
    runc = {**runc_cold, "QUINEBOX_STATE_DIR": str(work / "served-runc"), "QUINEBOX_SERVE": "manual"}
    first_env = {**cold, "QUINEBOX_STATE_DIR": str(work / "first"), "QUINEBOX_SERVE": "auto"}  # no server until its first call
    docker_run = [DOCKER, "run", "--rm", "--network", "none", DEFAULT_IMAGE, "true"]
    exec_true = [QUINEBOX, "exec", "--", "true"]
    rows: list[Row] = []
    waits = local_waiting_moves()
    print(f"image {DEFAULT_IMAGE}, {os.cpu_count()} cores, {runs} runs, {rounds} round(s) of {boxes} boxes; measured: {name}")
    print(f"cgroup moves: {'each waits a grace period (no favordynmods)' if waits else 'no grace period waited (favordynmods)'}\n")
    try:
        served_up(ours)
        served_up(runc)
        os.environ.update(ours)  # the API's side below runs in this process, on `name`, its server up

        # 1. one exec
        first = compare({f"through serve, {name}": command(exec_true, ours), "through serve, runc (warm pool)": command(exec_true, runc),
                         f"cold CLI, {name}": command(exec_true, cold), "cold CLI, runc": command(exec_true, runc_cold),
                         "docker run": command(docker_run, base)}, runs)
        ms = {side: median_s(values) * 1000 for side, values in first.items()}
        print(f"1. exec -- true, {runs} runs each, interleaved, medians")
        for side, value in ms.items():
            print(f"   {side:<40} {value:7.1f} ms   {value / ms['docker run']:.3f}× docker run")
        through = ms[f"through serve, {name}"] / ms["docker run"]
        warm_runc = ms["through serve, runc (warm pool)"]
        rows += [
            Row(f"1. exec -- true, through serve, {name}", f"{ms[f'through serve, {name}']:.1f} ms", f"{through:.3f}× docker run (target ≤ 0.08×)", through <= 0.08),
            Row("1. exec -- true, through serve, runc warm claim", f"{warm_runc:.1f} ms", f"{warm_runc / ms['docker run']:.3f}× docker run (reported)"),
            Row(f"1. exec -- true, cold CLI, {name}", f"{ms[f'cold CLI, {name}']:.1f} ms", f"{ms[f'cold CLI, {name}'] / ms['docker run']:.3f}× docker run (reported)"),
            Row("1. exec -- true, cold CLI, runc", f"{ms['cold CLI, runc']:.1f} ms", f"{ms['cold CLI, runc'] / ms['docker run']:.3f}× docker run (reported)"),
            Row(f"1. {name} cold box vs runc warm claim, through serve", f"{ms[f'through serve, {name}'] / warm_runc:.2f}×",
                "below 1: a cold box is already cheaper than a warm claim (reported)"),
            Row("1. docker run --rm --network none … true", f"{ms['docker run']:.1f} ms", "baseline"),
        ]

        # 2. the first call, which starts the server
        second = compare({f"first call, {name}": first_call(first_env), "docker run": command(docker_run, base)}, max(3, runs // 4))
        ms = {side: median_s(values) * 1000 for side, values in second.items()}
        ratio = ms[f"first call, {name}"] / ms["docker run"]
        print(f"\n2. the first call (it starts the server), {max(3, runs // 4)} runs each, interleaved, medians")
        for side, value in ms.items():
            print(f"   {side:<40} {value:7.1f} ms")
        rows += [Row(f"2. first exec -- true (starts the server), {name}", f"{ms[f'first call, {name}']:.1f} ms", f"{ratio:.2f}× docker run (target ≤ 0.9×)", ratio <= 0.9)]

        # 3. throughput at -P8
        count = ["seq", str(boxes)]
        batch = 60 + boxes * 3.0
        xargs = ["xargs", f"-P{PARALLEL}", "-I{}"]
        third = compare({f"exec -- true, through serve, {name}": command(xargs + exec_true, ours, timeout=batch, feed=count),
                         "exec -- true, through serve, runc": command(xargs + exec_true, runc, timeout=batch, feed=count),
                         "docker run --rm … true": command(xargs + docker_run, base, timeout=batch, feed=count)}, rounds)
        rate = {side: boxes / median_s(values) for side, values in third.items()}
        theirs = rate["docker run --rm … true"]
        print(f"\n3. throughput: {boxes} boxes at xargs -P{PARALLEL}, {rounds} round(s) each (after one warm-up batch), interleaved, medians")
        for side, values in third.items():
            print(f"   {side:<40} {median_s(values):7.2f} s   {rate[side]:7.2f} boxes/s   {rate[side] / theirs:5.2f}× docker run")
        mine = rate[f"exec -- true, through serve, {name}"] / theirs
        rows += [
            Row(f"3. {boxes} × exec -- true at -P{PARALLEL}, through serve, {name}", f"{rate[f'exec -- true, through serve, {name}']:.2f} boxes/s",
                f"{mine:.2f}× docker run (target ≥ 8×, bar ≥ 5×)", mine >= 5),
            Row("3. the same on runc (warm pool)", f"{rate['exec -- true, through serve, runc']:.2f} boxes/s",
                f"{rate['exec -- true, through serve, runc'] / theirs:.2f}× docker run (reported)"),
            Row(f"3. {boxes} × docker run at -P{PARALLEL}", f"{theirs:.2f} boxes/s", "baseline"),
        ]

        # 4. the Python API in this process
        import quinebox

        def api() -> Measured:
            with deadline(IN_PROCESS, "quinebox.exec(['true'])"):
                began = time.perf_counter()
                done = quinebox.exec(["true"])
                seconds = time.perf_counter() - began
            if done.returncode != 0:
                raise Failed(f"quinebox.exec(['true']) gave {done.returncode}: {done.stderr.decode(errors='replace')[-400:]}")
            return Measured(seconds, 0)

        fourth = compare({f"quinebox.exec, {name}": api, "docker-py containers.run": docker_py}, runs)
        ms = {side: median_s(values) * 1000 for side, values in fourth.items()}
        ratio = ms[f"quinebox.exec, {name}"] / ms["docker-py containers.run"]
        print(f"\n4. the Python API, in this process, {runs} runs each (after one warm-up call), interleaved, medians")
        for side, value in ms.items():
            print(f"   {side:<40} {value:7.1f} ms")
        rows += [
            Row(f"4. quinebox.exec(['true']), {name}", f"{ms[f'quinebox.exec, {name}']:.1f} ms", f"{ratio:.3f}× containers.run (target ≤ 0.03×)", ratio <= 0.03),
            Row("4. docker-py containers.run(…, 'true')", f"{ms['docker-py containers.run']:.1f} ms", "baseline"),
        ]
    except Failed as exc:
        return stopped(rows, exc)
    finally:
        serve_stop(ours)
        serve_stop(runc)
        no_server(first_env)
        shutil.rmtree(work, ignore_errors=True)
    return verdicts(rows)


if __name__ == "__main__":
    sys.exit(main())

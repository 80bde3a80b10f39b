"""The command server that starts itself (QUINEBOX_SERVE=auto, the default), side by side with `docker run`, in one run.

    .venv/bin/python bench/autostart.py [--runs 20]

Interleaved (the order rotating each round), each `--runs` times; medians quoted, each as a ratio to
`docker run --rm --network none IMAGE true`, on the OCI backend (runc):

1. `quinebox exec -- true` when no server answers: the call that starts one (detached; it runs its own
   command in-process meanwhile).                    target: ≤ 1.0× docker run
2. the same with the server that call started up.    target: ≤ 0.15× docker run
3. the cold CLI (QUINEBOX_SERVE=off), reported beside them: what the first call costs over it is the
   fork of the server and the CPU its imports take from the command on this 2-core machine.
4. what the server's freshness check (cli/freshness.py) costs per command, in this process.

Before each first call the server is stopped and waited gone; after it (untimed) the new server is
waited for, so that no side pays for another's start. Everything runs in a state dir of its own,
removed at the end, and every command has a deadline.
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
from collections.abc import Callable
from pathlib import Path

from measure import run_child

from quinebox.box.spec import DEFAULT_IMAGE

QUINEBOX = str(Path(sys.executable).with_name("quinebox"))
DOCKER = shutil.which("docker") or "docker"
#: How long a server may take to answer after a call started it, or to go after `serve stop`.
SERVER_DEADLINE = 60.0
#: After a server has gone, before the next call: the box its last command ran in is still being removed.
SETTLE = 0.5


def answering(env: dict[str, str]) -> dict | None:
    said = subprocess.run([QUINEBOX, "serve", "status", "--json"], env={**env, "QUINEBOX_SERVE": "manual"}, capture_output=True, timeout=60)
    return json.loads(said.stdout) if said.returncode == 0 else None


def until(predicate: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + SERVER_DEADLINE
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"not within {SERVER_DEADLINE:g} s: {what}; stopped, no figure made of it")
        time.sleep(0.05)


def no_server(env: dict[str, str]) -> None:
    """Stop the state dir's server, if one answers, and wait until its process is gone."""
    said = answering(env)
    if said is None:
        return
    subprocess.run([QUINEBOX, "serve", "stop"], env=env, capture_output=True, timeout=60)
    until(lambda: not os.path.exists(f"/proc/{said['pid']}"), f"server {said['pid']} gone after `serve stop`")
    time.sleep(SETTLE)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="quinebox-bench-autostart-"))
    env = {**os.environ, "QUINEBOX_STATE_DIR": str(work / "state"), "XDG_CONFIG_HOME": str(work / "config"),
           "QUINEBOX_BACKEND": "oci", "QUINEBOX_RUNTIME": "runc", "QUINEBOX_SERVE": "auto"}
    env.pop("QUINEBOX_POOL", None)
    (work / "config" / "quinebox").mkdir(parents=True)
    # Each round's server is a new one, which would start its pool only at its third command (warm.Demand): this
    # measures a server with its pool, as a state dir's commands that keep coming have it.
    (work / "config" / "quinebox" / "config.yaml").write_text("pool: {after: 0}\n")
    exec_true = [QUINEBOX, "exec", "--", "true"]
    docker_run = [DOCKER, "run", "--rm", "--network", "none", DEFAULT_IMAGE, "true"]

    def first() -> float:
        no_server(env)
        seconds = run_child(exec_true, env=env, deadline=120).seconds
        until(lambda: answering(env), "the server the first call started, answering")
        return seconds

    def server_up() -> float:
        if answering(env) is None:
            run_child(exec_true, env=env, deadline=120)
            until(lambda: answering(env), "a server answering")
        return run_child(exec_true, env=env, deadline=120).seconds

    sides: dict[str, Callable[[], float]] = {
        "first call, which starts the server": first,
        "with the server up": server_up,
        "cold CLI (QUINEBOX_SERVE=off)": lambda: run_child(exec_true, env={**env, "QUINEBOX_SERVE": "off"}, deadline=120).seconds,
        "docker run": lambda: run_child(docker_run, env=env, deadline=120).seconds,
    }
    try:
        for side in sides.values():
            side()  # warm: the image unpacked, the runtime and the page cache
        times: dict[str, list[float]] = {name: [] for name in sides}
        order = list(sides)
        for index in range(args.runs):
            shift = index % len(order)
            for name in order[shift:] + order[:shift]:
                times[name].append(sides[name]())
        ms = {name: statistics.median(values) * 1000 for name, values in times.items()}
        print(f"exec -- true on the OCI backend (runc), {args.runs} runs each, interleaved, medians, {os.cpu_count()} cores")
        for name, value in ms.items():
            print(f"   {name:<40} {value:7.1f} ms")
        base = ms["docker run"]
        starting, up = ms["first call, which starts the server"] / base, ms["with the server up"] / base
        print(f"   first call / docker run {starting:.2f} (target ≤ 1.0)   server up / docker run {up:.2f} (target ≤ 0.15)"
              f"   cold CLI / docker run {ms['cold CLI (QUINEBOX_SERVE=off)'] / base:.2f} (reported)")

        from quinebox.cli.freshness import fingerprint

        checks = []
        for _ in range(200):
            began = time.perf_counter()
            fingerprint()
            checks.append(time.perf_counter() - began)
        print(f"   the freshness check per command: {statistics.median(checks) * 1000:.2f} ms (median of 200)")
        missed = [name for name, met in (("first call", starting <= 1.0), ("server up", up <= 0.15)) if not met]
        print(f"\n{len(missed)} of 2 targets missed: {', '.join(missed)}" if missed else "\nevery target met")
        return 1 if missed else 0
    finally:
        no_server(env)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

"""With `retention: {size: …}` set, the state dir after 5,000 one-turn missions stays within that size (issue 36).

    .venv/bin/python bench/retention_size.py [--missions 5000] [--per-day 500] [--size 5m] [--parallel 8]

A state dir and config of its own; `quinebox map` of one-turn missions (scripted model: exit at once), `--per-day`
at a time. Retention runs at most once a day, so each batch is a day: before it, `retention.last` is set two days
back, and the map's own end starts `quinebox prune --retention` detached, as any command's end would. After each
day's retention has logged its line, the figures are taken:

- what retention weighs (the sessions, the world objects their worlds name, the sessions' index and the run
  records) against `--size`;
- the whole state dir but the image cache (the audit log too, which nothing prunes), for what else grows;
  at the end, what holds it, entry by entry.

Prints each day and the last; exits 1 if what retention weighs is over `--size` after any day's run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from measure import run_child

from quinebox.grants import parse_size
from quinebox.state import tree_bytes
from quinebox.tree.retention import weigh

QUINEBOX = str(Path(sys.executable).with_name("quinebox"))
#: The unpacked images, which retention's size does not count (`retention: {images: …}` is theirs).
IMAGE_CACHE = "images"


def weighed(state: Path) -> int:
    """What retention's size counts (retention.Weights.total)."""
    return weigh(state / "sessions").total()


def rest_of(state: Path) -> int:
    return sum(tree_bytes(entry.path) for entry in os.scandir(state) if entry.name != IMAGE_CACHE)


def pruned_lines(log: Path) -> list[str]:
    try:
        return [line for line in log.read_text().splitlines() if "pruned" in line]
    except FileNotFoundError:
        return []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--missions", type=int, default=5000)
    parser.add_argument("--per-day", type=int, default=500)
    parser.add_argument("--size", default="5m")
    parser.add_argument("--parallel", type=int, default=8)
    args = parser.parse_args()
    budget = parse_size(args.size)
    work = Path(tempfile.mkdtemp(prefix="quinebox-bench-retention-size-"))
    state, config = work / "state", work / "config"
    (config / "quinebox").mkdir(parents=True)
    (config / "quinebox" / "config.yaml").write_text(f"retention: {{size: {args.size}}}\n")
    env = {**os.environ, "QUINEBOX_BACKEND": "oci", "QUINEBOX_RUNTIME": "runc", "QUINEBOX_SERVE": "off",
           "QUINEBOX_STATE_DIR": str(state), "XDG_CONFIG_HOME": str(config)}
    script = work / "one-turn.yaml"
    script.write_text(json.dumps({"turns": [{"exit": "success"}]}))
    stamp, log = state / "retention.last", state / "retention.log"
    over = False
    began = time.monotonic()
    try:
        print(f"{args.missions} one-turn missions, {args.per_day} a day at -P{args.parallel}, retention: {{size: {args.size}}} "
              f"({budget / 1e6:.1f} MB); OCI runc, {os.cpu_count()} cores")
        print(f"{'day':>4} {'missions':>9} {'weighed':>11} {'rest of state':>14} {'run':>7}   retention said")
        done = day = 0
        while done < args.missions:
            count = min(args.per_day, args.missions - done)
            materials = work / "materials.jsonl"
            materials.write_text("".join(json.dumps(f"material {done + i}") + "\n" for i in range(count)))
            if stamp.exists():
                os.utime(stamp, (time.time() - 2 * 86400,) * 2)  # a day has gone by
            seen = len(pruned_lines(log))
            mapped = run_child([QUINEBOX, "map", "-m", f"script:{script}", "finish at once", "--jsonl", str(materials),
                                "-P", str(args.parallel), "-o", str(work / f"out{day}")], env=env, deadline=3600)
            shutil.rmtree(work / f"out{day}")
            until = time.monotonic() + 600
            while len(pruned_lines(log)) <= seen:
                if time.monotonic() > until:
                    raise SystemExit(f"day {day + 1}: retention logged nothing in 600 s: {log.read_text()[-500:] if log.exists() else 'no log'}")
                time.sleep(0.2)
            done, day = done + count, day + 1
            size = weighed(state)
            over |= size > budget
            said = pruned_lines(log)[-1].removeprefix("quinebox: ")
            print(f"{day:>4} {done:>9} {size / 1e6:>8.2f} MB {rest_of(state) / 1e6:>11.2f} MB {mapped.seconds:>6.0f}s   {said}")
        sessions = len(os.listdir(state / "sessions"))
        print(f"after {done} missions: {sessions} sessions kept, {weighed(state) / 1e6:.2f} MB weighed against {budget / 1e6:.2f} MB: "
              f"{'within' if not over else 'OVER'} ({(time.monotonic() - began) / 60:.1f} min in all)")
        print("the state dir but its sessions and images, by what holds it (retention counts sessions.db and runs; the audit log is never pruned):")
        for entry in sorted(os.scandir(state), key=lambda e: e.name):
            if entry.name not in (IMAGE_CACHE, "sessions"):
                print(f"   {entry.name:<24} {tree_bytes(entry.path) / 1e6:8.2f} MB")
        return 1 if over else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

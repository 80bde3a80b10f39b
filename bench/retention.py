"""What automatic retention (`retention:` in config.yaml) adds to `quinebox exec -- true`: nothing measurable (issue 36).

    .venv/bin/python bench/retention.py [--runs 30]

Two config dirs side by side, interleaved, each `--runs` times, medians printed (OCI backend, runc, the cold CLI:
QUINEBOX_SERVE=off, so every call is a whole quinebox process that ends by asking whether retention is due):

1. no `retention:` at all;
2. `retention: {age: 30d, count: 1000, size: 2g}`, having run today: what every command but the day's first pays
   (one stat of state/retention.last).

Each side has a state dir of its own (the image unpacked in each before timing). The day's first command's own
cost is reported apart: it starts `quinebox prune --retention` detached, and returns.
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

from measure import run_child

QUINEBOX = str(Path(sys.executable).with_name("quinebox"))
#: The most a median may differ by and still be "nothing measurable" here (this machine's run-to-run noise).
NOISE = 0.03


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="quinebox-bench-retention-"))
    base = {**os.environ, "QUINEBOX_BACKEND": "oci", "QUINEBOX_RUNTIME": "runc", "QUINEBOX_SERVE": "off"}
    envs = {}
    for name, config in (("no retention", ""), ("retention set, ran today", "retention: {age: 30d, count: 1000, size: 2g}\n")):
        (work / name / "config" / "quinebox").mkdir(parents=True)
        (work / name / "config" / "quinebox" / "config.yaml").write_text(config)
        envs[name] = {**base, "QUINEBOX_STATE_DIR": str(work / name / "state"), "XDG_CONFIG_HOME": str(work / name / "config")}
    exec_true = [QUINEBOX, "exec", "--", "true"]
    try:
        for env in envs.values():
            run_child(exec_true, env=env, deadline=120)  # the image unpacked; the retention side's day's first run
        stamp = work / "retention set, ran today" / "state" / "retention.last"
        deadline = time.monotonic() + 60
        while not stamp.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        times: dict[str, list[float]] = {name: [] for name in envs}
        order = list(envs)
        for index in range(args.runs):
            for name in order[index % 2 :] + order[: index % 2]:
                times[name].append(run_child(exec_true, env=envs[name], deadline=120).seconds)
        os.utime(stamp, (time.time() - 2 * 86400,) * 2)
        due = run_child(exec_true, env=envs["retention set, ran today"], deadline=120).seconds
        ms = {name: statistics.median(values) * 1000 for name, values in times.items()}
        print(f"exec -- true, cold CLI, OCI runc, {args.runs} runs each, interleaved, medians, {os.cpu_count()} cores")
        for name, value in ms.items():
            print(f"   {name:<28} {value:7.1f} ms")
        print(f"   the day's first command (starts the prune detached): {due * 1000:.1f} ms (one run)")
        ratio = ms["retention set, ran today"] / ms["no retention"]
        met = ratio <= 1 + NOISE  # faster is noise too
        print(f"   with / without: {ratio:.3f} (target: ≤ {1 + NOISE:.2f}, nothing measurable) {'ok' if met else 'NOT MET'}")
        return 0 if met else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

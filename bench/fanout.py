"""Throughput of a fan-out: quinebox map vs xargs + docker run, side by side in one run.

    .venv/bin/python bench/fanout.py [--missions 200] [--parallel 16] [--rounds 1] [--serve POOL]

quinebox: `quinebox map` of a one-turn mission (scripted model: exit at once)
over N materials at --parallel P. Docker: `xargs -P P docker run --rm
--network none IMAGE true`, N times. target: quinebox's throughput ≥ 4× Docker's on
an OCI runtime (≥ 0.85×, ≥ 1.5× through a server with a pool, on the Docker backend).
Also reports the root process's peak RSS during the map.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from measure import backend, run_child, served

from quinebox.box.spec import DEFAULT_IMAGE

QUINEBOX = str(Path(sys.executable).with_name("quinebox"))
DOCKER = shutil.which("docker") or "docker"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--missions", type=int, default=200)
    parser.add_argument("--parallel", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--image", default=DEFAULT_IMAGE)
    parser.add_argument("--serve", type=int, metavar="POOL", help="run quinebox through `quinebox serve --pool POOL` (target then ≥ 1.5)")
    args = parser.parse_args()
    with served(args.serve) as env:
        return compare(args, env)


def compare(args: argparse.Namespace, env: dict[str, str] | None) -> int:
    work = Path(tempfile.mkdtemp(prefix="quinebox-fanout-"))
    script = work / "one-turn.yaml"
    script.write_text(json.dumps({"turns": [{"exit": "success"}]}))
    materials = work / "materials.jsonl"
    materials.write_text("".join(json.dumps(f"material {i}") + "\n" for i in range(args.missions)))
    ours, theirs, rss = [], [], []
    for round_ in range(args.rounds):
        out = work / f"out{round_}"
        mapped = run_child([QUINEBOX, "map", "-m", f"script:{script}", "finish at once", "--jsonl", str(materials), "-P", str(args.parallel), "-o", str(out)], env=env)
        ours.append(mapped.seconds)
        rss.append(mapped.peak_kib)
        count = "".join(f"{i}\n" for i in range(args.missions)).encode()
        theirs.append(run_child(["xargs", "-P", str(args.parallel), "-I{}", DOCKER, "run", "--rm", "--network", "none", args.image, "true"], stdin=count).seconds)
    shutil.rmtree(work)
    ours_rate = args.missions / statistics.median(ours)
    theirs_rate = args.missions / statistics.median(theirs)
    ratio = ours_rate / theirs_rate
    where = backend()
    print(f"{args.missions} missions at --parallel {args.parallel}, {args.rounds} round(s), medians; boxes on {where}\n")
    print(f"quinebox map (one-turn missions)        {statistics.median(ours):6.1f} s   {ours_rate:5.2f} missions/s")
    print(f"xargs -P{args.parallel} docker run --rm ... true    {statistics.median(theirs):6.1f} s   {theirs_rate:5.2f} boxes/s")
    target = 4.0 if where != "docker" else 0.85 if env is None else 1.5
    print(f"throughput ratio                        {ratio:.2f}  (target ≥ {target}{f', through a server with a pool of {args.serve}' if env else ''})")
    print(f"quinebox peak RSS                       {max(rss) / 1024:.0f} MB{' (the thin client: the map runs in the server)' if env else ''}")
    return 0 if ratio >= target else 1


if __name__ == "__main__":
    sys.exit(main())

"""What a Ray cluster costs a fan-out: the local map vs the same map through a one-node Ray cluster, side by side.

    .venv/bin/python bench/cluster.py [--missions 200] [--parallel 8] [--rounds 1]

Both run N one-turn missions (scripted model: exit at once) at the same parallelism on this
machine's engine, interleaved round by round: the local runner, then the cluster's (one Ray node
advertising `quinebox: P`, a state dir of its own, its P worker processes started by a few
untimed inputs first). targets: the cluster's throughput ≥ 0.85 of the local map's, and the
time the cluster adds to each input (from dispatch until the attempt's outputs are staged at
home, less the node's run of the agent) ≤ 20 ms median. Then, from the measured per-box and per-dispatch costs,
what 10,000 missions on 20 such nodes would take.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from quinebox.cluster.connect import RESOURCE, connect
from quinebox.cluster.driver import ClusterRunner
from quinebox.tree.fanout import Options, Runner, map_jobs

QUIET = lambda tally, record: None  # noqa: E731 - a progress callback that shows nothing


def timed(runner: Runner) -> tuple[float, float]:
    """Wall seconds and this process's CPU seconds for one whole run."""
    began, cpu = time.monotonic(), time.process_time()
    code = runner.run()
    if code != 0:
        raise SystemExit(f"the run failed ({runner.tally.failed} of {runner.tally.total}): {runner.tally.failures[:5]}")
    return time.monotonic() - began, time.process_time() - cpu


def per_input(out: Path) -> list[float]:
    """Each input's time from its start to its line in results.jsonl."""
    return [json.loads(line)["duration_s"] for line in (out / "results.jsonl").read_text().splitlines()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--missions", type=int, default=200)
    parser.add_argument("--parallel", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()

    from ray.cluster_utils import Cluster

    work = Path(tempfile.mkdtemp(prefix="quinebox-cluster-bench-"))
    (work / "node").mkdir()
    script = work / "one-turn.yaml"
    script.write_text(json.dumps({"turns": [{"exit": "success"}]}))
    materials = work / "materials.jsonl"
    materials.write_text("".join(json.dumps(f"material {i}") + "\n" for i in range(args.missions)))
    head = {"num_cpus": args.parallel, "resources": {RESOURCE: args.parallel}, "include_dashboard": False, "env_vars": {"QUINEBOX_STATE_DIR": str(work / "node")}}
    ray_cluster = Cluster(initialize_head=True, head_node_args=head)
    try:
        cluster = connect(ray_cluster.address)
        jobs = map_jobs("finish at once", [], str(materials), model=f"script:{script}")
        local, remote, overheads, driver_cpu, durations = [], [], [], [], {"local": [], "remote": []}
        for round_ in range(args.rounds):
            local.append(timed(Runner(jobs, str(work / f"local{round_}"), Options(parallel=args.parallel), QUIET))[0])
            durations["local"].extend(per_input(work / f"local{round_}"))
            # Ray starts a worker process per concurrent task (about a second each) and stops idle ones: started here, not timed.
            ClusterRunner(jobs[: args.parallel], str(work / f"warm{round_}"), Options(parallel=args.parallel), QUIET, cluster).run()
            runner = ClusterRunner(jobs, str(work / f"remote{round_}"), Options(parallel=args.parallel), QUIET, cluster)
            seconds, cpu = timed(runner)
            remote.append(seconds)
            overheads.extend(runner.overheads)
            durations["remote"].extend(per_input(work / f"remote{round_}"))
            driver_cpu.append(cpu / len(jobs))
    finally:
        import ray

        ray.shutdown()
        ray_cluster.shutdown()
        shutil.rmtree(work, ignore_errors=True)

    local_rate = args.missions / statistics.median(local)
    remote_rate = args.missions / statistics.median(remote)
    ratio = remote_rate / local_rate
    added = (statistics.median(durations["remote"]) - statistics.median(durations["local"])) * 1000
    outside = statistics.median(overheads) * 1000
    cpu_ms = statistics.median(driver_cpu) * 1000
    print(f"{args.missions} one-turn missions at parallelism {args.parallel}, {args.rounds} round(s), medians\n")
    print(f"local quinebox map                  {statistics.median(local):6.1f} s   {local_rate:5.2f} missions/s")
    print(f"map --cluster (one Ray node)        {statistics.median(remote):6.1f} s   {remote_rate:5.2f} missions/s")
    print(f"throughput ratio                    {ratio:.2f}  (target ≥ 0.85)")
    print(f"per input, local (median)           {statistics.median(durations['local']) * 1000:.1f} ms")
    print(f"per input, cluster (median)         {statistics.median(durations['remote']) * 1000:.1f} ms")
    print(f"added per input: dispatch + result  {outside:.1f} ms median, {statistics.quantiles(overheads, n=10)[-1] * 1000:.1f} ms p90  (target ≤ 20 median)")
    print(f"  per-input medians' difference     {added:.1f} ms  (also Ray's own processes taking CPU from the boxes)")
    print(f"driver CPU per input                {cpu_ms:.1f} ms")
    # On paper: each node runs boxes as fast as this machine does; the driver dispatches and lands one input per `cpu_ms`.
    nodes, missions = 20, 10_000
    boxes_rate = nodes * remote_rate
    driver_rate = 1000 / cpu_ms if cpu_ms else float("inf")
    rate = min(boxes_rate, driver_rate)
    bound = "the nodes' engines" if boxes_rate <= driver_rate else "the driver"
    print(f"\n10,000 missions on 20 such nodes    ≈ {missions / rate / 60:.1f} min ({rate:.0f} missions/s, bound by {bound}: "
          f"nodes {boxes_rate:.0f}/s, driver {driver_rate:.0f}/s)")
    return 0 if ratio >= 0.85 and outside <= 20 else 1


if __name__ == "__main__":
    sys.exit(main())

"""What a short CI job leaves running: N commands in a temporary state dir, the dir removed, then a minute's wait.

    .venv/bin/python bench/linger.py [--commands 20] [--after 60] [--jobs 1]

Each job runs `quinebox exec -- true` `--commands` times, one after another, as a CI step does, with
QUINEBOX_SERVE=auto (the default: the first command starts a command server) and a state dir of its own, then
`rm -rf`s the dir that holds it, as the job's cleanup does, and nothing else: no `serve stop`. `--after` seconds
after the last job ended it counts what is left of them:

- processes: any whose environment names one of the jobs' state dirs (servers, their workers, pools' keepers);
- boxes: the OCI runtimes' box processes (in a `quinebox-*` cgroup made since the run began) and the engine's
  containers made since then (labelled io.quinebox.session, or a pool's);
- cgroups: the cgroups (named for their container) of the boxes the runtimes held as each job ended that are still there (a
  box's remains), empty or not.

Goal: none of each. Every command has a deadline; what a job left is ended at the end (by pid), and said so.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

QUINEBOX = str(Path(sys.executable).with_name("quinebox"))


def cgroups() -> set[str]:
    return set(glob.glob("/sys/fs/cgroup/*/quinebox-*") + glob.glob("/sys/fs/cgroup/quinebox-*") + glob.glob("/sys/fs/cgroup/*/quinebox.user-*/quinebox-*"))


def populated(cgroup: str) -> bool:
    try:
        with open(os.path.join(cgroup, "cgroup.procs")) as procs:
            return bool(procs.read().strip())
    except OSError:
        return False


def processes_of(states: list[str]) -> list[tuple[int, str]]:
    """(pid, command line) of each process whose environment names one of `states`."""
    found = []
    wanted = [f"QUINEBOX_STATE_DIR={state}".encode() for state in states]
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/environ", "rb") as environ:
                env = environ.read().split(b"\0")
            if not any(w in env for w in wanted):
                continue
            with open(f"/proc/{name}/cmdline", "rb") as cmdline:
                found.append((int(name), cmdline.read().replace(b"\0", b" ").decode(errors="replace")[:100]))
        except OSError:
            continue
    return found


def runtime_boxes(state: str) -> set[str]:
    """The ids of the boxes the OCI runtimes hold for `state` (its warm pool's among them), as the job ends."""
    found = set()
    for root in glob.glob(os.path.join(state, "oci", "*")):
        if os.path.isdir(root):
            for runtime in ("runc", "runsc"):
                listed = subprocess.run([runtime, "--root", root, "list", "-q"], capture_output=True, timeout=30)
                if listed.returncode == 0:
                    found.update(listed.stdout.decode().split())
                    break
    return found


def engine_boxes(since: float) -> list[str]:
    """The engine's quinebox containers created since `since` (none when there is no engine to ask)."""
    try:
        import docker

        engine = docker.from_env(timeout=10)
        made = engine.api.containers(all=True, filters={"label": "io.quinebox.session"}) + engine.api.containers(all=True, filters={"label": "io.quinebox.pool"})
    except Exception:  # noqa: BLE001 - no engine here (a rootless user): its boxes are none
        return []
    return sorted({box["Id"][:12] for box in made if box["Created"] >= since - 1})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commands", type=int, default=20)
    parser.add_argument("--after", type=float, default=60.0, help="seconds after the jobs end at which what is left is counted")
    parser.add_argument("--jobs", type=int, default=1)
    args = parser.parse_args()
    began, before = time.time(), cgroups()
    states, took, ours = [], [], set()
    for _ in range(args.jobs):
        work = tempfile.mkdtemp(prefix="quinebox-bench-linger-")
        state = os.path.join(work, "state")
        states.append(state)
        env = {**os.environ, "QUINEBOX_STATE_DIR": state, "QUINEBOX_SERVE": "auto"}
        env.pop("QUINEBOX_POOL", None)
        start = time.monotonic()
        for _ in range(args.commands):
            subprocess.run([QUINEBOX, "exec", "--", "true"], env=env, capture_output=True, timeout=120, check=True)
        took.append(time.monotonic() - start)
        ours.update(runtime_boxes(state))
        subprocess.run(["rm", "-rf", work], capture_output=True, timeout=120)  # may say a dir was not empty: something wrote meanwhile
    print(f"{args.jobs} job(s) of {args.commands} × `quinebox exec -- true` (QUINEBOX_SERVE=auto), each {min(took):.1f}–{max(took):.1f} s, state dir removed at its end")
    time.sleep(args.after)
    left = processes_of(states)
    made = {c for c in cgroups() - before if os.path.basename(c) in ours}  # a box's cgroup is named for its container; other runs' boxes on this machine are not counted
    boxes = sorted({os.path.basename(c) for c in made if populated(c)}) + engine_boxes(began)
    remains = sorted({os.path.basename(c) for c in made} - set(boxes))
    print(f"{args.after:g} s later: {len(left)} process(es), {len(boxes)} box(es) running, the empty cgroups of {len(remains)} more")
    for pid, cmdline in left:
        print(f"   process {pid}: {cmdline}")
    for box in boxes:
        print(f"   box {box}")
    for box in remains:
        print(f"   cgroups of box {box} (empty)")
    for pid, _ in left:  # a bench leaves nothing of its own behind
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for state in states:
        shutil.rmtree(os.path.dirname(state), ignore_errors=True)
    return 1 if left or boxes else 0


if __name__ == "__main__":
    sys.exit(main())

"""What one world revision costs after one file changed, against a `cp -a` snapshot of the same world.

    .venv/bin/python bench/worlds.py [--files 10000] [--size 4096] [--runs 15]

Each run changes one file of a 10,000-file world, then (interleaved, same run)
takes a revision and a `cp -a` copy of the world. Time is wall time; disk is
what each adds to the state dir (new objects and revision log bytes) or to the
copy's directory (allocated blocks). Figures for:

1. a world of its own (the default at the host, and `--world DIR`): inotify
   names the changed path, the revision rereads only it.
2. an inherited world (a child's copy-on-write layer over that world): the
   layer is read likewise, then merged over the parent's manifest.

target: a revision ≥ 20× cheaper than the copy, in time and in disk (medians).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET = 20.0


def disk_use(path: Path) -> int:
    total = 0
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


def fill(root: Path, files: int, size: int) -> list[Path]:
    paths = []
    per_dir = 100
    for i in range(files):
        d = root / f"d{i // per_dir:03}"
        d.mkdir(exist_ok=True)
        p = d / f"f{i % per_dir:03}.txt"
        p.write_bytes(os.urandom(size))
        paths.append(p)
    return paths


def state_bytes(state: Path) -> int:
    return disk_use(state / "objects") + sum(p.stat().st_size for p in (state / "sessions").glob("*/world/revisions.jsonl"))


def measure(label: str, world, files: list[Path], copy_from: Path, scratch: Path, state: Path, runs: int) -> bool:
    rng = random.Random(7)
    rev_s, rev_disk, cp_s, cp_disk = [], [], [], []
    # cp's best case: the world in the page cache, and no deletions of earlier copies competing for the disk.
    subprocess.run(["cp", "-a", str(copy_from), str(scratch / f"{label[:1]}-warm")], check=True)
    for i in range(runs):
        rng.choice(files).write_bytes(os.urandom(files[0].stat().st_size))
        before = state_bytes(state)
        began = time.perf_counter()
        record = world.revise("sh", turn=i + 1, command="change one file")
        rev_s.append(time.perf_counter() - began)
        rev_disk.append(state_bytes(state) - before)
        assert record["files"] == 1, record
        target = scratch / f"{label[:1]}-copy{i}"
        began = time.perf_counter()
        subprocess.run(["cp", "-a", str(copy_from), str(target)], check=True)
        cp_s.append(time.perf_counter() - began)
        cp_disk.append(disk_use(target))
    t_rev, t_cp = statistics.median(rev_s), statistics.median(cp_s)
    d_rev, d_cp = statistics.median(rev_disk), statistics.median(cp_disk)
    time_ratio, disk_ratio = t_cp / t_rev, d_cp / max(d_rev, 1)
    ok = time_ratio >= TARGET and disk_ratio >= TARGET
    print(f"{label}:")
    print(f"  revision  {t_rev * 1000:8.2f} ms  {d_rev / 1024:10.1f} KiB   (median of {runs})")
    print(f"  cp -a     {t_cp * 1000:8.2f} ms  {d_cp / 1024:10.1f} KiB")
    print(f"  ratio     {time_ratio:8.1f}×     {disk_ratio:10.1f}×      target ≥ {TARGET:g}× in both: {'met' if ok else 'NOT met'}")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10000)
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="quinebox-bench-") as tmp:
        scratch = Path(tmp)
        state = scratch / "state"
        os.environ["QUINEBOX_STATE_DIR"] = str(state)
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from quinebox.worlds.build import create
        from quinebox.worlds.spec import WorldSpec, child_world, world_dir
        from quinebox.worlds.world import World

        spec = WorldSpec(kind="dir", layer=str(world_dir("bench-own") / "tree"))
        create("bench-own", spec, os.getuid(), os.getgid())
        paths = fill(Path(spec.layer), args.files, args.size)
        print(f"a world of {args.files} files of {args.size} bytes; each run changes one file\n")
        own = World("bench-own", spec)
        ok = measure("1. a world of its own", own, paths, Path(spec.layer), scratch, state, args.runs)

        child = child_world(own, "bench-child", "inherit")
        create("bench-child", child, os.getuid(), os.getgid())
        upper = Path(child.layer)
        # What overlay does on a write through the child's view: copy the file up into the child's layer.
        copied = []
        for p in paths[:: max(1, args.files // 50)]:
            rel = p.relative_to(spec.layer)
            (upper / rel.parent).mkdir(parents=True, exist_ok=True)
            copied.append(upper / rel)
            shutil.copy2(p, upper / rel)
        inherited = World("bench-child", child)
        ok &= measure("\n2. an inherited (copy-on-write) world", inherited, copied, Path(spec.layer), scratch, state, args.runs)
        inherited.close()
        own.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""`quinebox prune` of 10,000 finished sessions: under 30 s (issue 36).

    .venv/bin/python bench/prune.py [--sessions 10000]

In a state dir of its own (removed at the end), the real store makes each session as a run leaves it: an
index row, a tape of a few records, and a world of two files with its first revision (one file the same in
every world, one its own: so each pruned session frees one object, and the shared one stays). A tenth of
them ended recently and stay. Then `quinebox prune --older-than 1d` runs as a user runs it, timed from
start to exit; the sessions, objects and index it leaves are checked, and the figures printed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

QUINEBOX = str(Path(sys.executable).with_name("quinebox"))
TARGET = 30.0
DAY = 86400.0


def populate(count: int) -> None:
    from quinebox.agent.store import Index, Tape
    from quinebox.worlds.build import create
    from quinebox.worlds.spec import WorldSpec, world_dir
    from quinebox.worlds.world import World

    index = Index()
    for n in range(count):
        session = f"bench-{n:06d}"
        index.start(session, parent=None, mission=f"mission {n}", model="script")
        tape = Tape(session)
        for turn in range(3):
            tape.append("turn", n=turn, text="x" * 200)
        tape.close()
        spec = WorldSpec(kind="dir", layer=str(world_dir(session) / "tree"))
        create(session, spec, os.getuid(), os.getgid())
        (Path(spec.layer) / "shared.txt").write_text("the same in every world\n")
        (Path(spec.layer) / "own.txt").write_text(f"session {n}\n")
        World(session, spec, track=False).close()
        index.finish(session, exit_code=n % 3 and 1, termination="done", tokens=10, turns=3)
    old = [f"bench-{n:06d}" for n in range(count) if n % 10]
    with index._db:  # the nine in ten that ended over a day ago
        index._db.executemany("UPDATE sessions SET started = started - ?, ended = ended - ? WHERE id = ?", [(2 * DAY, 2 * DAY, s) for s in old])
    index.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    args = parser.parse_args()
    state = Path(tempfile.mkdtemp(prefix="qb-prune-bench-"))
    os.environ["QUINEBOX_STATE_DIR"] = str(state)
    try:
        began = time.monotonic()
        populate(args.sessions)
        made = time.monotonic() - began
        objects = sum(len(files) for top, _, files in os.walk(state / "objects") if Path(top).parent.name == "objects" and len(Path(top).name) == 2)
        print(f"made {args.sessions} sessions in {made:.1f} s: {objects} objects", flush=True)
        began = time.monotonic()
        done = subprocess.run([QUINEBOX, "prune", "--older-than", "1d"], capture_output=True, text=True, timeout=600, env={**os.environ, "QUINEBOX_SERVE": "off"})
        took = time.monotonic() - began
        if done.returncode != 0:
            sys.exit(f"prune failed ({done.returncode}): {done.stderr.strip()}")
        left = len(os.listdir(state / "sessions"))
        expected = sum(1 for n in range(args.sessions) if n % 10 == 0)
        after = sum(len(files) for top, _, files in os.walk(state / "objects") if Path(top).parent.name == "objects" and len(Path(top).name) == 2)
        print(done.stderr.strip())
        print(f"sessions left {left} (expected {expected}); objects {objects} -> {after} (expected {expected + 1})")
        verdict = "ok" if took < TARGET and left == expected and after == expected + 1 else "NOT MET"
        print(f"prune of {args.sessions - expected} finished sessions: {took:.2f} s (target < {TARGET:g} s) {verdict}")
    finally:
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()

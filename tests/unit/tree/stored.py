"""Sessions as runs leave them, made by the real store (index, tape, world) with no box: what the prune and
retention tests prune."""

import hashlib
import os

from quinebox.agent.store import Index, SessionRow, Tape
from quinebox.worlds.build import create
from quinebox.worlds.spec import WorldSpec, world_dir
from quinebox.worlds.world import World

NOW = 1_000_000.0
DAY = 86400.0


def row(id, *, ended=NOW - 10 * DAY, started=None, exit_code=0, parent=None):
    started = (ended if ended is not None else NOW) - 60 if started is None else started
    return SessionRow(id, parent, f"mission {id}", "script", started, ended, exit_code, "done" if ended else None, 0, 1)


def session(id, files, *, ended=True, exit_code=0, parent=None, age=10 * DAY):
    """A session as a run leaves it: an index row, a tape, and a world of `files` with a revision."""
    index = Index()
    index.start(id, parent=parent, mission=f"mission {id}", model="script")
    tape = Tape(id)
    tape.append("start", mission=f"mission {id}")
    tape.close()
    spec = WorldSpec(kind="dir", layer=str(world_dir(id) / "tree"))
    create(id, spec, os.getuid(), os.getgid())
    for name, data in files.items():
        (world_dir(id) / "tree" / name).write_bytes(data)
    World(id, spec, track=False).close()
    if ended:
        index.finish(id, exit_code=exit_code, termination="done", tokens=0, turns=1)
        index._write("UPDATE sessions SET started = started - ?, ended = ended - ? WHERE id = ?", (age, age, id))
    index.close()
    return spec


def objects(state):
    root = state / "objects"
    return {fan.name + item.name for fan in root.iterdir() if len(fan.name) == 2 for item in fan.iterdir()}


def data(state):
    """Every file of sessions, objects and runs (not the locks and leases), and the index's rows."""
    files = sorted(str(p.relative_to(state)) for top in ("sessions", "objects", "runs") for p in (state / top).rglob("*") if not p.name.endswith(".lock") and "leases" not in p.parts)
    index = Index()
    rows = index.every()
    index.close()
    return files, rows


def sha(data):
    return hashlib.sha256(data).hexdigest()

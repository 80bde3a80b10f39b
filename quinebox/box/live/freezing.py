"""Pausing a long-lived box: every process of it stopped where it is, then let go on; its clocks stop with it.

Each backend's own way (Box.freeze and Box.thaw, in its room), and each leaves the box killable while paused:
runc's cgroup freezer written directly (backends/oci/freezer.py), gVisor's `runsc pause`, the engine's pause.

A paused box has a marker in its record's directory (run/sandboxes/<session>.paused: when, and why) for as long
as it is paused, which every process reads: an exec into it is refused in one line (`refuse_if_paused`, called
where execs start: Sandbox's, `exec --in`, `cp` and `enter`), `box ls` says paused, and its owner's clocks — its
TTL, its idle limit — stand still (the Sandbox holds them while the marker is there).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from quinebox.box.backends.boxes import Box
from quinebox.box.live.sandboxes import records_dir, used
from quinebox.errors import QuineboxError

#: What a pause is for: a person's (or a program's) pause, or the instant a checkpoint is taken at.
PAUSED, CHECKPOINT = "paused", "checkpoint"


@dataclass(frozen=True)
class Pause:
    since: float
    why: str


def marker(session: str) -> Path:
    return records_dir() / f"{session}.paused"


def pause_of(session: str) -> Pause | None:
    """The box's pause, while it is paused."""
    try:
        said = json.loads(marker(session).read_text())
        return Pause(float(said["since"]), str(said["why"]))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return Pause(0.0, PAUSED)  # one being written: paused all the same


def refuse_if_paused(session: str) -> None:
    """Refuse an exec into a paused box, in one line (where execs start: see the module's docstring). `session`
    may be the start of one, as `quinebox enter` takes it."""
    pause = pause_of(session)
    if pause is None:
        found = [path.name.removesuffix(".paused") for path in records_dir().glob(f"{session}*.paused")] if session else []
        if len(found) != 1:
            return
        session, pause = found[0], pause_of(found[0])
        if pause is None:
            return
    if pause.why == CHECKPOINT:
        raise QuineboxError(f"box {session} is paused while a checkpoint of it is taken: run the command again in a moment")
    raise QuineboxError(f"box {session} is paused: `quinebox box resume {session}` first")


def mark(session: str, why: str, since: float | None = None) -> None:
    """The box's marker says it is paused, since `since` (now), for `why`: execs are refused from now on."""
    path = records_dir(make=True) / f"{session}.paused"
    scratch = path.with_suffix(".pausing")
    scratch.write_text(json.dumps({"since": time.time() if since is None else since, "why": why}))
    scratch.rename(path)


def unmark(session: str) -> None:
    marker(session).unlink(missing_ok=True)


def pause(box: Box, session: str) -> None:
    """Stop every process of the box; the marker first, so no exec starts once the box is being stopped."""
    if pause_of(session) is not None:
        raise QuineboxError(f"box {session} is paused already")
    mark(session, PAUSED)
    try:
        freeze(box)
    except BaseException:
        unmark(session)
        raise


def resume(box: Box, session: str) -> float:
    """Let every process of the box go on; how long it was paused (the clocks that stood still meanwhile)."""
    pause = pause_of(session)
    if pause is None:
        raise QuineboxError(f"box {session} is not paused")
    if pause.why == CHECKPOINT:
        raise QuineboxError(f"box {session} is paused while a snapshot of it is taken: it goes on once that is done")
    thaw(box)
    unmark(session)
    return max(0.0, time.time() - pause.since)


def idle_clock_stood(session: str, since: float, paused: float) -> None:
    """The box's idle clock stood still for the `paused` seconds it was paused: its last use (or `since`, its
    making) moves on by as long, as a holder's idle limit reads it (sandboxes.used)."""
    last = used(session, since) + paused
    path = records_dir(make=True) / f"{session}.used"
    path.touch()
    os.utime(path, (last, last))


def freeze(box: Box) -> None:
    """Every process of the box stopped, in its backend's way (Box.freeze); a backend that cannot: one line."""
    if not box.capabilities.pause:
        raise QuineboxError(f"cannot pause box {box.session}: {box.why_not('pause')}")
    box.freeze()


def thaw(box: Box) -> None:
    if not box.capabilities.pause:
        raise QuineboxError(f"cannot resume box {box.session}: {box.why_not('pause')}")
    box.thaw()

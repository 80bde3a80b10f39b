"""Pausing a long-lived box: every process of it stopped where it is, then let go on; its clocks stop with it.

Each backend's own way, and each leaves the box killable while paused:

- runc: the cgroup freezer, written directly (v1's freezer.state, as on this machine's hybrid hierarchy; the
  unified hierarchy's cgroup.freeze where there is no v1 freezer), ~1 ms where `runc pause` is a Go start-up.
  The box's execs' cgroups lie below its own, so they stop with it, and runc reads its paused state from the same
  file. A frozen process of v1 does not die of SIGKILL until it is thawed, so whoever kills a paused box resumes
  it first (the Sandbox does; runc's own kill and delete thaw what they signal).
- gVisor: `runsc pause`, its kernel stopping its tasks. The host's freezer would stop the sentry itself, which
  would then answer nothing — not a checkpoint, not the runtime's kill — until thawed.
- the engine: its pause (its kill and removal work on a paused box).

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
from quinebox.box.backends.dockerbox import DockerBox
from quinebox.box.backends.runtimebox import RuntimeBox
from quinebox.box.live.sandboxes import records_dir, used
from quinebox.errors import EngineError, QuineboxError

#: What a pause is for: a person's (or a program's) pause, or the instant a checkpoint is taken at.
PAUSED, CHECKPOINT = "paused", "checkpoint"
#: How long the freezer may take to stop every process of a box (it waits for each to leave the kernel).
FREEZE_WITHIN = 5.0
#: Where the cgroup hierarchies are: the v1 freezer's, and the unified one's (v2's, or a hybrid's beside v1).
CGROUPS = Path("/sys/fs/cgroup")


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
    if isinstance(box, DockerBox):
        box.engine.pause(box.id)
    elif isinstance(box, RuntimeBox) and box.runtime.gvisor:
        box.runtime.pause(box.id)
    elif isinstance(box, RuntimeBox):
        _set_freezer(box, frozen=True)
    else:
        raise QuineboxError(f"cannot pause a box on {box.backend}")


def thaw(box: Box) -> None:
    if isinstance(box, DockerBox):
        box.engine.unpause(box.id)
    elif isinstance(box, RuntimeBox) and box.runtime.gvisor:
        box.runtime.resume(box.id)
    elif isinstance(box, RuntimeBox):
        _set_freezer(box, frozen=False)
    else:
        raise QuineboxError(f"cannot resume a box on {box.backend}")


def freezer_files(cgroup: str, root: Path = CGROUPS) -> tuple[Path, str, Path, str]:
    """(the file to write, what to write, the file that says when it is done, what it then says) for freezing
    `cgroup`; thawing writes and waits for the other words (`_WORDS`). v1's freezer where the host has one."""
    v1 = root / "freezer" / cgroup.strip("/") / "freezer.state"
    if v1.parent.is_dir():
        return v1, "FROZEN", v1, "FROZEN"
    for unified in (root / "unified", root):
        group = unified / cgroup.strip("/")
        if (group / "cgroup.freeze").exists():
            return group / "cgroup.freeze", "1", group / "cgroup.events", "frozen 1"
    raise EngineError(f"no cgroup freezer for {cgroup} here (neither v1's freezer nor cgroup.freeze): the box cannot be paused")


#: Each freezer's words for frozen, and for thawed.
_WORDS = {"FROZEN": "THAWED", "1": "0", "frozen 1": "frozen 0"}


def _set_freezer(box: RuntimeBox, *, frozen: bool) -> None:
    try:
        cgroup = json.loads((box.bundle / "config.json").read_text())["linux"]["cgroupsPath"]
    except (OSError, ValueError, KeyError, TypeError):
        raise EngineError(f"box {box.session} is going away: its bundle is gone") from None
    control, word, done, said = freezer_files(cgroup)
    if not frozen:
        word, said = _WORDS[word], _WORDS[said]
    until = time.monotonic() + FREEZE_WITHIN
    try:
        control.write_text(word)
        while said not in done.read_text().splitlines():
            if time.monotonic() > until:
                if frozen:
                    control.write_text(_WORDS[word])
                raise EngineError(f"box {box.session} did not {'stop' if frozen else 'go on'} within {FREEZE_WITHIN:g} s: a process of it is stuck in the kernel")
            time.sleep(0.0005)
    except OSError as exc:
        raise EngineError(f"cannot {'pause' if frozen else 'resume'} box {box.session}: its cgroup freezer refused ({exc.strerror})") from None

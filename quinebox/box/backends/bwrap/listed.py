"""A bwrap box as whoever lists the boxes sees it (ps, kill, rm, gc, `exec --in`, pause): a Box (boxes.py) read from
the record its starter keeps (box.py: state_dir()/bwrap/<id>.json), since bwrap has no runtime state of its own to ask.

A record names the box's PID 1 by its host pid and its /proc start time, so a pid the kernel handed out again is never
taken for it: a record whose process is gone, or started at another time, is a dead box ("exited"), whose removal
(`destroy`: box.py's remove_remains) kills what is left in its cgroup, removes the cgroup and the record and frees its
ids. Its pause is its own cgroup's freezer (cgroups.py's BoxCgroup). What bwrap cannot do, said in one line each:

- no checkpoint: bwrap has no checkpoint and restore, and quinebox takes snapshots on gVisor only;
- no exec of the backend's own: bwrap enters no running box (it has no `exec`), so a command reaches a bwrap box only
  through its init, which the box's holder asks (live/exec_ways.py's InitWay; `quinebox exec --in` asks the holder);
- no exec as another user, root included: the box's user namespace maps one id alone, its own user's, to the
  unprivileged host id it runs as (own_user_namespace False: an exec as the box's root is not possible).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from quinebox.box.backends.boxes import Box, Capabilities, Way
from quinebox.box.backends.bwrap.box import read_record, records_dir, remove_remains
from quinebox.box.backends.bwrap.cgroups import BoxCgroup
from quinebox.box.backends.choice import BWRAP
from quinebox.box.policy import LABEL_SESSION
from quinebox.errors import EngineError
from quinebox.processes import pid_alive

#: What a bwrap box can do (the module's docstring says why each False is).
CAPABILITIES = Capabilities(pause=True, checkpoint=False, own_user_namespace=False, host_processes=True, stdio_files=True)


class ListedBwrap(Box):
    """One bwrap box of this state dir's, from its record (box.py's schema)."""

    backend = BWRAP
    label = "bubblewrap (bwrap)"
    capabilities = CAPABILITIES

    def __init__(self, record: Mapping[str, Any], labels: Mapping[str, str] | None = None):
        """`labels`: what the caller knows of the box over the record's own (a lasting box's record names its session)."""
        self.record = record
        self.id = str(record.get("id") or "")
        self.labels = {**(labels or {}), **(record.get("labels") or {})}
        self.state = "running" if self.alive() else "created" if record.get("pid") is None and self._holder_alive() else "exited"
        command = record.get("command") or ""
        self.command = " ".join(command) if isinstance(command, list) else str(command)
        self.image_root = str(record.get("image_root") or "")
        self.made = float(record.get("made") or 0.0)

    def alive(self) -> bool:
        """Whether the box's PID 1 runs: its pid, started when the record says (a reused pid is another process)."""
        pid, start = self.record.get("pid"), self.record.get("start")
        return isinstance(pid, int) and pid > 0 and start is not None and pid_alive(pid, str(start))

    def _holder_alive(self) -> bool:
        """Whether the process that starts the box still runs (a record with no pid yet is a box being made)."""
        holder = self.record.get("holder_pid")
        if not isinstance(holder, int) or holder <= 0:
            return False
        try:
            os.kill(holder, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True

    @property
    def cgroup(self) -> BoxCgroup:
        return BoxCgroup.at(str(self.record.get("cgroup") or ""))

    def kill(self, signal_name: str = "KILL") -> bool:
        """SIGKILL: every process in the box's cgroup (thawed first: a frozen process dies only once thawed), bwrap's
        included; another signal: the box's PID 1 alone, as a runtime's kill sends it to its init. A box that has ended
        already is not running either way (True); False when the host refused the signal."""
        try:
            if signal_name.upper().removeprefix("SIG") == "KILL":
                if self.record.get("cgroup"):
                    self.cgroup.kill()
                if self.alive():  # a box whose cgroup could not be read: its PID 1 at least
                    os.kill(int(self.record["pid"]), signal.SIGKILL)
            elif self.alive():
                os.kill(int(self.record["pid"]), signal.Signals[f"SIG{signal_name.upper().removeprefix('SIG')}"])
        except ProcessLookupError:
            return True
        except (PermissionError, KeyError):
            return False
        return True

    def destroy(self) -> bool:
        """Killed, its cgroups removed, its ids freed and its record deleted (box.py's remove_remains, idempotent)."""
        return remove_remains(dict(self.record))

    def process(self) -> tuple[str, str]:
        """The box's user (`uid:gid` inside) and working directory, as its record says them."""
        user, cwd = self.record.get("user"), self.record.get("cwd")
        if not user:
            raise EngineError(f"box {self.session} is going away: its record is gone")
        return str(user), str(cwd or "/")

    def why_not(self, capability: str) -> str:
        if capability == "checkpoint":
            return "bwrap has no checkpoint and restore (quinebox takes snapshots on gVisor only)"
        if capability == "own_user_namespace":
            return (f"its user namespace maps the box's own user ({self.record.get('user') or '?'}) alone, "
                    "so no exec in it runs as another user, root included")
        if capability == "exec":
            return ("bwrap enters no running box: a command reaches it through its init only, asked by the box's holder "
                    "(`quinebox exec --in` asks it), with no terminal and as the box's own user; a box to enter: start it with --backend oci")
        return super().why_not(capability)

    def freeze(self) -> None:
        self._freezer(frozen=True)

    def thaw(self) -> None:
        self._freezer(frozen=False)

    def _freezer(self, *, frozen: bool) -> None:
        """The box's own cgroup's freezer (its execs' cgroups lie below it and stop with it)."""
        if not self.alive():
            raise EngineError(f"box {self.session} is going away: its process has ended")
        group = self.cgroup
        try:
            group.freeze() if frozen else group.thaw()
        except EngineError as exc:
            raise EngineError(f"box {self.session}: {exc}") from None

    def exec_way(self, session: str, *, tty: bool, guard: bool) -> Way:
        raise self.lacking("exec")


def listed_bwrap(container: str, labels: Mapping[str, str]) -> ListedBwrap:
    """The box a record names by its id (a lasting box's, reopened with no listing asked); EngineError once it is gone."""
    record = read_record(records_dir() / f"{container}.json")
    if record is None:
        raise EngineError(f"box {labels.get(LABEL_SESSION, container)} is gone: its record is not there (`quinebox box ls`)")
    return ListedBwrap(record, labels)


def bwrap_boxes() -> list[ListedBwrap]:
    """Every bwrap box this state dir's records name, running or dead (a dead one is listed until its remains go)."""
    directory = records_dir()
    found = []
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else ():
        record = read_record(Path(path))
        if record is not None and record.get("id"):
            found.append(ListedBwrap(record))
    return found

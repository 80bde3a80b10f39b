"""The record of each `map` and `batch` run in the state dir, so a viewer can follow one live or look back.

    runs/<run-id>/run.json        what the run was asked to do and whose process runs it (written once, before any job)
    runs/<run-id>/attempts.jsonl  one line per attempt as it starts: {"t", "name", "source", "session"}
    runs/<run-id>/end.json        how it ended (absent while it runs, and after a SIGKILL: its owner then is dead)

How each input finished is already in DIR/results.jsonl (fanout.py), whose lines carry the run's id;
this adds only what that file cannot say: the run itself, what is queued and what runs now. The record is
a bystander: a write that fails (a full disk, an unwritable state dir) costs the record, never the run.
It holds the mission: its dirs are 0700 and its files 0600 whatever the umask (state.py).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

from quinebox.documents import json_objects
from quinebox.processes import owner_id
from quinebox.state import private_dir, private_file, private_write, state_dir

RUN = "run.json"
ATTEMPTS = "attempts.jsonl"
END = "end.json"


def runs_dir() -> Path:
    return state_dir() / "runs"


def new_id(now: float | None = None) -> str:
    """Sorts by start time (to the millisecond, in UTC), then a random part so two runs that start together differ."""
    now = time.time() if now is None else now
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime(now)) + f"{int(now * 1000) % 1000:03d}-{secrets.token_hex(6)}"


def attempted(run: Path) -> set[str]:
    """The sessions a run's attempts started (runs/<id>/attempts.jsonl); a line that is not a record passes over."""
    try:
        data = (run / ATTEMPTS).read_bytes()
    except FileNotFoundError:
        return set()
    return {line["session"] for line in json_objects(data.split(b"\n")) if isinstance(line.get("session"), str)}


class RunRecord:
    """Writes one run's record; every method swallows the state dir's failures (see the module's docstring)."""

    def __init__(self, kind: str, mission: str | None, out: Path):
        self.id = new_id()
        self.kind = kind
        self.mission = mission
        self.out = out
        self.dir = runs_dir() / self.id

    def begin(self, jobs: Iterable[Any], resumed: Collection[str]) -> None:
        """Before the first job starts: every input (`jobs` have name and source), and the sources `--resume` skips
        because an earlier run finished them (their lines in results.jsonl carry that run's id)."""
        jobs = list(jobs)
        pid = os.getpid()
        owner = owner_id()
        run = {
            "id": self.id, "kind": self.kind, "mission": self.mission, "out": str(self.out.resolve()), "started": time.time(),
            "pid": pid, "pid_start": owner.rsplit(":", 1)[1], "owner": owner, "total": len(jobs),
            "inputs": [{"name": job.name, "source": job.source} for job in jobs], "resumed": sorted(resumed),
        }
        try:
            private_dir(self.dir)
        except OSError:
            return
        self._write_json(RUN, run)

    def attempt(self, name: str, source: str, session: str | None) -> None:
        """An attempt has started: `session` as soon as its agent's session exists (None where only a later moment knows it)."""
        line = json.dumps({"t": time.time(), "name": name, "source": source, "session": session}) + "\n"
        try:
            fd = private_file(self.dir / ATTEMPTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        except OSError:
            return
        try:
            os.write(fd, line.encode())  # one write of one line: readers never see two attempts interleaved
        except OSError:
            pass
        finally:
            os.close(fd)

    def end(self, exit_code: int) -> None:
        self._write_json(END, {"ended": time.time(), "exit_code": exit_code})

    def _write_json(self, name: str, value: dict[str, Any]) -> None:
        """Whole or not at all: a reader sees the old file (or none), never half of the new one."""
        try:
            private_write(self.dir / name, json.dumps(value).encode())
        except OSError:
            pass

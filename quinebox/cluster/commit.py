"""What lands on the driver, once per input: an attempt's staged outputs, its sessions and their tapes.

An attempt streams home into staging files (hidden ones beside DIR's outputs, its tapes under the
state dir's `cluster/`), so landing is a rename on one filesystem. The first attempt of an input
to land wins; any later one (Ray ran the task again, or a retry raced a slow node) is thrown away.
"""

from __future__ import annotations

import os
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quinebox.state import session_dir
from quinebox.tree.fanout import Attempt


@dataclass
class Staged:
    """One attempt, received whole and not yet landed."""

    name: str
    number: int
    node: str
    attempt: Attempt
    out: Path
    err: Path
    #: Its staging directory on the driver, holding each session's tape as SESSION.tape.
    tapes: Path
    sessions: list[dict[str, Any]] = field(default_factory=list)
    #: What the cluster added to this input's time: dispatch and streaming home, less the node's run of the agent.
    overhead_s: float = 0.0

    def discard(self) -> None:
        for path in (self.out, self.err):
            path.unlink(missing_ok=True)
        shutil.rmtree(self.tapes, ignore_errors=True)


class Commits:
    """The inputs landed so far in DIR, and by which attempt."""

    def __init__(self, out: Path):
        self.out = out
        self.landed: dict[str, int] = {}
        self._lock = threading.Lock()
        self._index: Any = None  # the sessions index, opened at the first landing and kept: one open per run, not per input

    def close(self) -> None:
        if self._index is not None:
            self._index.close()
            self._index = None

    def commit(self, staged: Staged) -> bool:
        """Land `staged` if no attempt at its input has; False (and nothing of it kept) if one has."""
        with self._lock:
            if staged.name in self.landed:
                staged.discard()
                return False
            self.landed[staged.name] = staged.number
            if self._index is None:
                from quinebox.agent.store import Index

                self._index = Index()
        from quinebox.agent.store import SessionRow

        for row in staged.sessions:
            tape = session_dir(row["id"]) / "tape.jsonl"
            tape.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staged.tapes / f"{row['id']}.tape", tape)
            self._index.put(SessionRow(**row))
        os.replace(staged.err, self.out / f"{staged.name}.err")
        os.replace(staged.out, self.out / f"{staged.name}.out")
        shutil.rmtree(staged.tapes, ignore_errors=True)
        return True

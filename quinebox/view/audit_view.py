"""The audit log as the view reads it: read once, then only what was appended since.

The log names every box of every kind (`box_created` with its owner and parent, `box_ended` with how it
ended), so it is where the view learns of boxes that are not agents (an in-box `quinebox exec`) and
whether a session's owner is still alive. A long log is read once per server, not once per page.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from typing import Any

from quinebox.audit import approvals
from quinebox.audit.boxes import CREATED, BoxLife, take
from quinebox.audit.log import AuditLog, verify
from quinebox.documents import json_objects
from quinebox.view.redact import secret_names

#: Newest records kept for the audit page.
RECENT = 2000


class AuditTail:
    """Boxes and recent records from the audit log, kept current by `refresh()`."""

    def __init__(self) -> None:
        self.path = AuditLog().path
        self.boxes: dict[str, BoxLife] = {}
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT)
        #: The variables any box was granted as a secret, by name: their values are what the view must never send.
        self.secret_names: set[str] = set()
        #: Sessions by their parent's, so a tree finds a box's children without reading every box ever logged.
        self._children: dict[str, list[str]] = {}
        self._verdict: tuple[tuple[int, int], dict[str, Any]] | None = None
        self._offset = 0
        self._identity: tuple[int, int] | None = None
        self._partial = b""
        self._lock = threading.Lock()

    def refresh(self) -> bool:
        """Read what was appended; True when anything was. A log replaced or cut shorter is read again from its start."""
        with self._lock:
            try:
                st = os.stat(self.path)
            except FileNotFoundError:
                return False
            if (st.st_dev, st.st_ino) != self._identity or st.st_size < self._offset:
                self._identity, self._offset, self._partial = (st.st_dev, st.st_ino), 0, b""
                self.boxes.clear()
                self.recent.clear()
                self._children.clear()
            if st.st_size == self._offset:
                return False
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read(st.st_size - self._offset)
            self._offset += len(data)
            lines = (self._partial + data).split(b"\n")
            self._partial = lines.pop()
            for record in json_objects(lines):
                self._take(record)
            return True

    def _take(self, record: dict[str, Any]) -> None:
        self.recent.append(record)
        known = isinstance(record.get("session"), str) and record["session"] in self.boxes
        box = take(self.boxes, record)
        if box is None or record.get("kind") != CREATED:
            return
        self.secret_names |= secret_names(box.grants)
        if box.parent is not None and not known:
            self._children.setdefault(box.parent, []).append(box.session)

    def children(self, session: str) -> list[BoxLife]:
        with self._lock:
            return [self.boxes[child] for child in self._children.get(session, ())]

    def box(self, session: str) -> BoxLife | None:
        with self._lock:
            return self.boxes.get(session)

    def stamp(self) -> tuple[int, int]:
        return (self._identity or (0, 0))[1], self._offset

    def page(self, limit: int) -> dict[str, Any]:
        """The newest `limit` records, the chain's verdict and what waits for a person."""
        self.refresh()
        with self._lock:
            records = list(self.recent)[-limit:]
        return {"verify": self.verdict(), "records": records, "pending": pending()}

    def verdict(self) -> dict[str, Any]:
        """`audit verify`'s verdict, made again only when the log changed: it hashes the whole log."""
        stamp = self.stamp()
        if self._verdict is None or self._verdict[0] != stamp:
            found = verify()
            self._verdict = (stamp, {"intact": found.intact, "line": found.line(), "records": found.records})
        return self._verdict[1]


def pending() -> list[dict[str, Any]]:
    """Requests waiting for a person, with what they asked for; never the process that asked (its owner id, or an old record's pid)."""
    return [{k: v for k, v in entry.items() if k not in ("owner", "pid")} for entry in approvals.pending()]


def pending_stamp() -> tuple[str, ...]:
    """The ids of the requests waiting, which change whenever one is asked, answered, or its asker dies."""
    return tuple(sorted(str(entry.get("id")) for entry in approvals.pending()))

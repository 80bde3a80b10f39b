"""Sessions on disk: each session's append-only tape and the SQLite index of all of them.

    sessions.db                SQLite index: one row per session
    sessions/<id>/tape.jsonl   append-only record of a session, fsynced per record

Both are the user's alone whatever the umask (state.py): a tape holds the mission and every answer of the
model, the index every mission. Dirs are made 0700, the tape, the index (SQLite's -wal and -shm take its
mode) and its lock 0600.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import astuple, dataclass
from typing import Any

from quinebox.agent.records import Outcome, Records, as_dict, parse, read_file
from quinebox.errors import StateError
from quinebox.processes import owner_alive
from quinebox.state import private_dir, private_file, session_dir, state_dir, unwritable


class Tape:
    """One session's append-only record. Each record is one JSON line, on disk before append returns;
    a record that cannot be written whole (a full disk) is not written at all: StateError."""

    def __init__(self, session: str):
        self.path = session_dir(session) / "tape.jsonl"
        try:
            private_dir(self.path.parent)
            self._fd = private_file(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        except OSError as exc:
            raise StateError(unwritable(f"session {session}'s tape", exc), what=f"session {session}'s tape") from exc
        self._lock = threading.Lock()

    def append(self, kind: str, **fields: Any) -> None:
        fields.pop("t", None)  # the time is the host's: a "t" that a box sent with its event cannot stand in for it
        record = {"t": round(time.time(), 3), "kind": kind, **fields}
        line = json.dumps(record, ensure_ascii=False, default=str).encode() + b"\n"
        with self._lock:
            end = os.lseek(self._fd, 0, os.SEEK_END)
            try:
                view = memoryview(line)
                while view:
                    view = view[os.write(self._fd, view) :]
                os.fsync(self._fd)
            except OSError as exc:
                os.ftruncate(self._fd, end)  # no half record: the tape stays whole
                raise StateError(unwritable(f"the tape {self.path}", exc), what=f"the tape {self.path}") from exc

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def read_tape(session: str) -> list[dict[str, Any]]:
    """The tape's records as the JSON objects they were written as, each checked against its kind's schema
    (records.py); a line that is none passes over. Readers that want the typed records use `read_records`."""
    return [as_dict(record) for record in read_records(session)]


def read_records(session: str) -> Records:
    """The tape's typed records, and how many lines were passed over."""
    return read_file(session_dir(session) / "tape.jsonl")


def follow_tape(session: str, stop: threading.Event | None = None, poll: float = 0.2) -> Iterator[dict[str, Any]]:
    """Records as they are appended (as `read_tape` gives them), until the outcome record (or `stop`)."""
    path = session_dir(session) / "tape.jsonl"
    with open(path, "rb") as f:
        pending = b""
        while not (stop and stop.is_set()):
            chunk = f.readline()
            if not chunk:
                time.sleep(poll)
                continue
            pending += chunk
            if not pending.endswith(b"\n"):
                continue
            record = parse(pending)
            pending = b""
            if record is None:
                continue
            yield as_dict(record)
            if isinstance(record, Outcome):
                return


@dataclass
class SessionRow:
    id: str
    parent: str | None
    mission: str
    model: str
    started: float
    ended: float | None
    exit_code: int | None
    termination: str | None
    tokens: int
    turns: int


_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    parent TEXT,
    mission TEXT NOT NULL,
    model TEXT NOT NULL,
    started REAL NOT NULL,
    ended REAL,
    exit_code INTEGER,
    termination TEXT,
    tokens INTEGER NOT NULL DEFAULT 0,
    turns INTEGER NOT NULL DEFAULT 0
)
"""
#: Sessions `quinebox prune` took: their rows are gone, and this says when, for `show` and the rest to say so.
_PRUNED = "CREATE TABLE IF NOT EXISTS pruned (id TEXT PRIMARY KEY, at REAL NOT NULL)"
#: The process running each session (`host:pid:start`): one not ended whose owner is gone was interrupted, and
#: `quinebox resume` makes itself the owner. A table of its own, so that an index from before it opens as it was.
_OWNERS = "CREATE TABLE IF NOT EXISTS owners (id TEXT PRIMARY KEY, owner TEXT NOT NULL)"


class Index:
    """The sessions index. One short transaction per write; readers never block writers for long."""

    def __init__(self) -> None:
        import sqlite3  # `exec` needs the state dir's paths but never the index: keep it off that path

        path = state_dir() / "sessions.db"
        self._lock = threading.Lock()
        #: SQLite's own failures (a full disk); its transactions leave the index whole either way.
        self._failed = sqlite3.Error
        try:
            private_dir(path.parent)
            # Opened one at a time: two first opens race on the switch to WAL, which SQLite answers with "database is
            # locked" at once instead of waiting (seen when `map` starts its first agents on a fresh state dir).
            with open(private_file(path.with_name("sessions.db.lock"), os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab") as opening:
                fcntl.flock(opening, fcntl.LOCK_EX)
                os.close(private_file(path, os.O_RDWR | os.O_CREAT))  # made 0600 here: SQLite would make it 0644
                self._db = sqlite3.connect(path, timeout=30, check_same_thread=False)
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute(_SCHEMA)
                self._db.execute(_PRUNED)
                self._db.execute(_OWNERS)
        except (OSError, sqlite3.Error) as exc:
            raise StateError(unwritable("the sessions index", exc), what="the sessions index") from exc

    def _write(self, sql: str, params: tuple[Any, ...]) -> None:
        try:
            with self._lock, self._db:
                self._db.execute(sql, params)
        except self._failed as exc:
            raise StateError(unwritable("the sessions index", exc), what="the sessions index") from exc

    def start(self, session: str, *, parent: str | None, mission: str, model: str, owner: str | None = None) -> None:
        try:
            with self._lock, self._db:
                self._db.execute("INSERT INTO sessions (id, parent, mission, model, started) VALUES (?, ?, ?, ?, ?)", (session, parent, mission, model, time.time()))
                if owner is not None:
                    self._db.execute("INSERT OR REPLACE INTO owners VALUES (?, ?)", (session, owner))
        except self._failed as exc:
            raise StateError(unwritable("the sessions index", exc), what="the sessions index") from exc

    def claim(self, session: str, owner: str) -> None:
        """`owner` runs the session from now on: it was resumed."""
        self._write("INSERT OR REPLACE INTO owners VALUES (?, ?)", (session, owner))

    def interrupted(self, rows: list[SessionRow]) -> set[str]:
        """Those of `rows` not ended whose process is gone: it died before it could end them (`quinebox resume`)."""
        owners = self.owners([row.id for row in rows if row.ended is None])
        return {session for session, owner in owners.items() if not owner_alive(owner)}

    def owners(self, sessions: list[str]) -> dict[str, str]:
        """The process running each of `sessions` that has one recorded (sessions from before owners were, and
        those brought home from a cluster's nodes, have none)."""
        found: dict[str, str] = {}
        with self._lock:
            for start in range(0, len(sessions), 500):
                chunk = sessions[start : start + 500]
                marks = ",".join("?" * len(chunk))
                found.update(self._db.execute(f"SELECT id, owner FROM owners WHERE id IN ({marks})", chunk).fetchall())
        return found

    def finish(self, session: str, *, exit_code: int, termination: str, tokens: int, turns: int) -> None:
        self._write(
            "UPDATE sessions SET ended = ?, exit_code = ?, termination = ?, tokens = ?, turns = ? WHERE id = ?",
            (time.time(), exit_code, termination, tokens, turns, session),
        )

    def put(self, row: SessionRow) -> None:
        """A whole row as another machine's index holds it: a session run on a cluster node, brought home."""
        self._write("INSERT OR REPLACE INTO sessions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", astuple(row))

    def subtree(self, session: str) -> list[SessionRow]:
        """The session and every session below it, parents before their children."""
        rows = [row for row in [self.get(session)] if row is not None and row.id == session]
        for row in rows:  # grows as it goes: breadth first
            rows.extend(self.children(row.id))
        return rows

    def get(self, session: str) -> SessionRow | None:
        rows = self._select("WHERE id = ? OR id LIKE ?", (session, f"{session}%"))
        return rows[0] if len(rows) == 1 else None

    def children(self, session: str) -> list[SessionRow]:
        return self._select("WHERE parent = ? ORDER BY started", (session,))

    def running(self) -> list[SessionRow]:
        """Sessions not ended (or whose owner died before it could end them)."""
        return self._select("WHERE ended IS NULL ORDER BY started", ())

    def every(self) -> list[SessionRow]:
        return self._select("ORDER BY started", ())

    def forget(self, sessions: list[str], at: float) -> None:
        """Pruned: their rows go and a tombstone each says when, in one transaction."""
        try:
            with self._lock, self._db:
                self._db.executemany("DELETE FROM sessions WHERE id = ?", [(s,) for s in sessions])
                self._db.executemany("DELETE FROM owners WHERE id = ?", [(s,) for s in sessions])
                self._db.executemany("INSERT OR REPLACE INTO pruned VALUES (?, ?)", [(s, at) for s in sessions])
        except self._failed as exc:
            raise StateError(unwritable("the sessions index", exc), what="the sessions index") from exc

    def pruned(self, session: str) -> tuple[str, float] | None:
        """The one pruned session `session` names (an id or a prefix) and when it was pruned; None for none or several."""
        with self._lock:
            rows = self._db.execute("SELECT id, at FROM pruned WHERE id = ? OR id LIKE ? LIMIT 2", (session, f"{session}%")).fetchall()
        return (rows[0][0], rows[0][1]) if len(rows) == 1 else None

    def every_pruned(self) -> dict[str, float]:
        """Each pruned session, and when."""
        with self._lock:
            return dict(self._db.execute("SELECT id, at FROM pruned").fetchall())

    def recent(self, limit: int = 50) -> list[SessionRow]:
        return self._select("ORDER BY started DESC LIMIT ?", (limit,))

    def version(self) -> tuple[Any, ...]:
        """Changes whenever a session starts or ends: what a live view polls instead of reading every row."""
        with self._lock:
            return tuple(self._db.execute("SELECT COUNT(*), COUNT(ended), MAX(started), MAX(ended), SUM(turns) FROM sessions").fetchone())

    def _select(self, where: str, params: tuple[Any, ...]) -> list[SessionRow]:
        with self._lock:
            cursor = self._db.execute(
                f"SELECT id, parent, mission, model, started, ended, exit_code, termination, tokens, turns FROM sessions {where}", params
            )
            return [SessionRow(*row) for row in cursor.fetchall()]

    def close(self) -> None:
        self._db.close()

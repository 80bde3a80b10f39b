"""Noticing that the engine stopped answering while boxes run, and remembering it for `quinebox doctor`.

A box's event stream ends when the engine dies, but an engine that wedges
(seen on these machines: a `runc create` hung for minutes, and `docker info`
and `docker kill` with it) only goes quiet. So while any box of this process
is live, one thread pings the engine every PING_EVERY seconds; when a ping
fails, every live box is told, its wait ends with exit 125 and one line, and
the box itself dies as soon as its owner lets go of its lifeline.

Each such failure is kept as one line in the state dir's `engine.log`, so that
`quinebox doctor` can say what happened and when.
"""

from __future__ import annotations

import json
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from quinebox.errors import QuineboxError
from quinebox.state import state_dir

PING_EVERY = 2.0
#: After a kill that was not ours, how long to watch whether the engine is on its way down.
SHUTDOWN_GRACE = 3.0
#: What `doctor` shows: incidents of the last day, the newest few.
RECENT_S = 24 * 3600

Lost = Callable[[str], None]


class EngineWatch:
    """The pinging thread of one backend, running only while it has boxes to tell."""

    def __init__(self, backend: Any):
        self.backend = backend
        self._boxes: dict[int, Lost] = {}
        self._next = 0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, lost: Lost) -> int:
        """Call `lost(reason)` if the engine stops answering; the token for `discard`."""
        with self._lock:
            self._next += 1
            self._boxes[self._next] = lost
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="engine-watch", daemon=True)
                self._thread.start()
            return self._next

    def discard(self, token: int) -> None:
        with self._lock:
            self._boxes.pop(token, None)

    def _run(self) -> None:
        while True:
            time.sleep(PING_EVERY)
            with self._lock:
                if not self._boxes:
                    self._thread = None
                    return
            try:
                self.backend.ping()
            except QuineboxError as exc:
                with self._lock:
                    told, self._boxes = list(self._boxes.values()), {}
                record_incident(f"{len(told)} box(es) given up: {exc}", boxes=len(told))
                for lost in told:
                    lost("the Docker engine stopped answering while the box ran")


def engine_went_away(backend: Any, *, died: bool, destroyed: bool, outside: bool) -> bool:
    """Whether a box's end was the engine's: its event stream ended first, or the engine killed it on its way
    down (a stopping engine stops its boxes, then closes its API)."""
    if not died:
        return True
    if not destroyed:
        return not _answers(backend)
    if outside:  # a kill we did not send: the engine shutting down, or someone's `docker stop`
        until = time.monotonic() + SHUTDOWN_GRACE
        while time.monotonic() < until:
            if not _answers(backend):
                return True
            time.sleep(0.25)
    return False


def _answers(backend: Any) -> bool:
    try:
        backend.ping()
        return True
    except QuineboxError:
        return False


_watches: weakref.WeakKeyDictionary[Any, EngineWatch] = weakref.WeakKeyDictionary()
_watches_lock = threading.Lock()


def watch(backend: Any, lost: Lost) -> tuple[EngineWatch, int]:
    """Tell `lost` if `backend`'s engine stops answering; (the watch, the token to discard)."""
    with _watches_lock:
        engine_watch = _watches.get(backend)
        if engine_watch is None:
            engine_watch = _watches[backend] = EngineWatch(backend)
    return engine_watch, engine_watch.add(lost)


def record_incident(what: str, **facts: Any) -> None:
    """One line in engine.log (`backend`: whose failure it was, when not the engine's); never fails (the state dir
    may be what is full)."""
    line = json.dumps({"t": round(time.time(), 3), "what": what, **facts}) + "\n"
    try:
        with open(state_dir() / "engine.log", "a") as log:
            log.write(line)
    except OSError:
        pass


def recent_incidents(limit: int = 5) -> list[dict[str, Any]]:
    try:
        lines = (state_dir() / "engine.log").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines[-200:]:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and time.time() - float(record.get("t", 0)) < RECENT_S:
            found.append(record)
    return found[-limit:]

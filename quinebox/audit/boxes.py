"""A box's life as the audit log holds it: the `box_created` and `box_ended` records, and the moments its time
was revised between them (paused, resumed, a snapshot taken, restored from one), read into one typed record.

The tree writes both (tree/supervisor.py): `box_created` as a box is about to start, with its owner, parent,
grants and image, and `box_ended` once it is gone, with its exit status and why it ended. The log is the only
record that names every box of every kind, agents and in-box commands alike, so the view (which boxes run,
whose owner is gone) and the traces (one span per box) read boxes here, and only here.

Records are taken as found: the log is ours, but its facts echo what boxes asked for, and a reader must never
crash on a field of the wrong type, so such a field is left out (None, [] or False) rather than trusted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

#: The kinds of the two records a box leaves in the audit log.
CREATED = "box_created"
ENDED = "box_ended"
#: The records of a box's time revised (box/live, sandbox.py, tree/resume.py), each by the word the view
#: shows, and the facts of it worth showing with their types: anything else in such a record is left out.
MOMENTS: dict[str, tuple[str, dict[str, type]]] = {
    "box_paused": ("paused", {}),
    "box_resumed": ("resumed", {"paused_s": float}),
    "snapshot_taken": ("snapshot", {"snapshot": str, "bytes": int, "transient": bool}),
    "box_restored": ("restored", {"snapshot": str, "box": str}),
    "session_resumed": ("resumed after its host died", {"turn": int}),
}


@dataclass
class BoxLife:
    """One box as the audit log saw it: created (when, by whom, below whom, with what) and, once over, ended."""

    session: str
    created: float | None = None
    ended: float | None = None
    parent: str | None = None
    agent: bool = False
    #: The `host:pid:start` of the process that started it (processes.owner_alive says if it still runs).
    owner: str | None = None
    grants: list[str] = field(default_factory=list)
    image: str | None = None
    exit_code: int | None = None
    termination: str | None = None
    #: Its time revised, in order: each {"t", "what"} and the facts MOMENTS keeps for its kind.
    moments: list[dict[str, Any]] = field(default_factory=list)

    @property
    def paused(self) -> bool:
        """Paused now: it runs on, and its last pause was not yet followed by a resume."""
        turns = [m["what"] for m in self.moments if m["what"] in ("paused", "resumed")]
        return self.ended is None and turns[-1:] == ["paused"]

    def take(self, kind: str, time: float | None, facts: dict[str, Any]) -> None:
        """What one of the box's records says of it."""
        if kind == CREATED:
            self.created = time
            self.parent = _text(facts.get("parent"))
            self.agent = facts.get("agent") is True
            self.owner = _text(facts.get("owner")) or None
            grants = facts.get("grants")
            self.grants = [g for g in grants if isinstance(g, str)] if isinstance(grants, list) else []
            self.image = _text(facts.get("image"))
        elif kind == ENDED:
            self.ended = time
            exit_code = facts.get("exit")
            self.exit_code = exit_code if isinstance(exit_code, int) and not isinstance(exit_code, bool) else None
            self.termination = _text(facts.get("termination"))
        elif kind in MOMENTS:
            what, kept = MOMENTS[kind]
            moment: dict[str, Any] = {"t": time, "what": what}
            for name, kind_of in kept.items():
                value = facts.get(name)
                if kind_of is float and isinstance(value, int) and not isinstance(value, bool):
                    value = float(value)
                if isinstance(value, kind_of) and (kind_of is bool or not isinstance(value, bool)):
                    moment[name] = value
            self.moments.append(moment)


def take(boxes: dict[str, BoxLife], record: Any) -> BoxLife | None:
    """Fold one audit record into `boxes` (by session); the box it told of, or None when it is no box record."""
    if not isinstance(record, dict) or record.get("kind") not in (CREATED, ENDED, *MOMENTS) or not isinstance(record.get("session"), str):
        return None
    facts: dict[str, Any] = record["facts"] if isinstance(record.get("facts"), dict) else {}
    box = boxes.setdefault(record["session"], BoxLife(record["session"]))
    box.take(record["kind"], _epoch(record.get("time")), facts)
    return box


def box_lives(records: Iterable[Any]) -> dict[str, BoxLife]:
    """Each box the records saw created or ended, by session."""
    boxes: dict[str, BoxLife] = {}
    for record in records:
        take(boxes, record)
    return boxes


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _epoch(value: Any) -> float | None:
    """An audit record's ISO time as epoch seconds, or None."""
    try:
        return datetime.fromisoformat(value).timestamp() if isinstance(value, str) else None
    except (ValueError, OverflowError, OSError):  # not a time, or one the platform cannot turn into seconds
        return None

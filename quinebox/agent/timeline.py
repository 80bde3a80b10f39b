"""Revisable time: a recorded session as it stood at any turn — its conversation from the tape, its world from the revisions.

`quinebox fork SESSION --at TURN` starts a new session from there: the model
sees the conversation up to (not including) its answer at TURN, the box gets
the world of the revision that was current when that turn was asked, and
everything after is live.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from quinebox.agent.records import Request, Response, as_dict
from quinebox.agent.store import read_records
from quinebox.errors import QuineboxError
from quinebox.worlds.revisions import RevisionLog

#: What the guest keeps of a model's reply in its conversation (and so what the model saw next turn).
KEPT = ("role", "content", "tool_calls")


@dataclass(frozen=True)
class Moment:
    session: str
    turn: int
    messages: list[dict[str, Any]]
    revision: int
    meta: dict[str, Any]


def moment(session: str, turn: int) -> Moment:
    tape = read_records(session)
    if not tape:
        raise QuineboxError(f"no recorded session {session!r}: `quinebox ls` lists them")
    meta = tape.meta()
    conversation: list[dict[str, Any]] = []
    cycle = None
    for record in tape:
        if isinstance(record, Response):
            conversation.append({k: v for k, v in as_dict(record.message).items() if k in KEPT})
        elif isinstance(record, Request):
            if record.cycle != cycle:  # exec started a fresh conversation
                cycle, conversation = record.cycle, []
            conversation.extend(record.messages)
            if record.turn == turn:
                return Moment(session, turn, conversation, _revision_at(session, record.t), as_dict(meta) if meta else {})
    turns = len(tape.of(Request))
    raise QuineboxError(f"session {session} has no turn {turn}: it made {turns} model call(s), turns 1 to {turns}")


def _revision_at(session: str, when: float) -> int:
    """The newest revision taken before `when` (revisions are taken before the next turn is asked)."""
    records = RevisionLog(session).records()
    if not records:
        raise QuineboxError(f"session {session} kept no world revisions, so it cannot be forked with its world")
    return max(r["rev"] for r in records if r["t"] <= when or r["rev"] == 0)

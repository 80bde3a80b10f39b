"""Revisable time: a recorded session as it stood at any turn — its conversation from the tape, its world from the revisions.

`quinebox fork SESSION --at TURN` starts a new session from there: the model
sees the conversation up to (not including) its answer at TURN, the box gets
the world of the revision that was current when that turn was asked, and
everything after is live.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from quinebox.agent.records import Records, Request, Response, as_dict
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
    asked = conversation_at(tape, turn)
    if asked is None:
        turns = len({r.turn for r in tape.of(Request)})
        raise QuineboxError(f"session {session} has no turn {turn}: it made {turns} model call(s), turns 1 to {turns}")
    request, conversation = asked
    return Moment(session, turn, conversation, revision_at(session, request.t), as_dict(meta) if meta else {})


def conversation_at(tape: Records, turn: int) -> tuple[Request, list[dict[str, Any]]] | None:
    """The request that first asked `turn`, and the conversation as it sent it (the model's answer not yet in it);
    None when the tape asked no such turn.

    A request records only the messages new since the agent's last one, and each answer the model gave is in the
    conversation after it; an exec starts the conversation afresh. A turn asked again after a resume has the same
    conversation (its request adds no message), so the first is the one read."""
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
                return record, conversation
    return None


def revision_at(session: str, when: float) -> int:
    """The newest revision taken before `when` (revisions are taken before the next turn is asked)."""
    records = RevisionLog(session).records()
    if not records:
        raise QuineboxError(f"session {session} kept no world revisions, so it cannot be forked with its world")
    return max(r["rev"] for r in records if r["t"] <= when or r["rev"] == 0)

"""Where an interrupted session goes on from, read from its tape: what `quinebox resume` starts it again with.

A session whose process was lost (SIGKILL, a reboot, the host's OOM killer) keeps its tape and its world; its
box died with its lifeline. A turn is complete once the agent asked for the next one: that request carries the
turn's tool results as the model was to read them. So a session goes on from its last request — the turn in
flight — with the conversation as it was sent then, and that turn runs once more: when the model's answer to it
was recorded, that answer is taken again and its tool calls run again (the model is not asked, nor paid, twice
for it); else the model is asked again. Whatever came after the last request (a tool's partial work, a world
revision, a child it started) was the in-flight turn's, and is done again rather than kept.

What was spent stays spent: every token the session's model calls used (an answer taken again included), the
children it started before the turn in flight (the spawn budget; the in-flight turn's start again and count
once), its wall-clock time (up to its last record), and its exec cycles. Pure: the tree does the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from quinebox.agent.records import Meta, Records, Request, Response, Resumed, Spawn, as_dict
from quinebox.agent.timeline import conversation_at


@dataclass(frozen=True)
class Resumption:
    """An interrupted session's resume point: the turn that runs again, and what the session had by then."""

    #: The turn in flight (the session's count, across its conversations); 1 when it never asked its model.
    turn: int = 1
    #: Its conversation (exec cycle), and its place in that conversation, from 1: the turn budget is per conversation.
    cycle: int = 0
    turn_in_cycle: int = 1
    #: The conversation as it was sent at `turn`; empty when there was no request: the agent starts afresh.
    messages: list[dict[str, Any]] = field(default_factory=list)
    #: The model's recorded answer at `turn` ({"message", "usage"}), whose tool calls run again; None: ask again.
    answer: dict[str, Any] | None = None
    #: When `turn` was asked: the world goes back to the revision current then. None: at the start.
    asked_at: float | None = None
    #: Bytes of the material (stdin) the agent's tools had read when `turn` was asked; None: the tape does not say.
    material: int | None = 0
    #: Tokens the session's own model calls used, and how many answers the model gave it (a script goes on after them).
    tokens: int = 0
    answers: int = 0
    #: The sessions it started before `turn` was asked (their results are in the conversation), and each one's
    #: cost to the spawn budget: itself and the children it may start in turn.
    children: tuple[str, ...] = ()
    spawn_costs: tuple[int, ...] = ()
    #: Seconds the session ran, over each run of it, up to its last record.
    ran_for: float = 0.0
    #: The world's revision it goes on with, once the tree has made the world so (None: a world that keeps none).
    revision: int | None = None


def resumption(tape: Records) -> Resumption:
    """The resume point of the session whose tape this is (see the module's docstring)."""
    answers = tape.of(Response)
    spent = Resumption(tokens=sum(int(r.usage.get("total_tokens") or 0) for r in answers), answers=len(answers), ran_for=ran_for(tape))
    records = list(tape)
    asks = [i for i, r in enumerate(records) if isinstance(r, Request)]
    if not asks:
        return spent
    last = records[asks[-1]]
    assert isinstance(last, Request)
    asked = conversation_at(tape, last.turn)
    assert asked is not None  # the tape asked it
    answer = next((r for r in records[asks[-1] + 1 :] if isinstance(r, Response) and r.turn == last.turn), None)
    dropped = superseded(records)
    spawned = [r for i, r in enumerate(records[: asks[-1]]) if isinstance(r, Spawn) and i not in dropped]
    first_of_cycle = next(r.turn for r in tape.of(Request) if r.cycle == last.cycle)
    return replace(
        spent,
        turn=last.turn,
        cycle=last.cycle,
        turn_in_cycle=last.turn - first_of_cycle + 1,
        messages=asked[1],
        answer={"message": as_dict(answer.message), "usage": dict(answer.usage)} if answer else None,
        asked_at=last.t,
        material=last.material,
        children=tuple(r.child for r in spawned),
        spawn_costs=tuple(1 + spawn_grant(r.grants) for r in spawned),
    )


def superseded(records: list[Any]) -> set[int]:
    """Positions of the records a resume set aside: those after the session's last request before each `resumed`
    record, up to it. They were the turn in flight when the session was lost, which ran again after the resume
    (an answer among them is taken again, and stays the turn's)."""
    dropped: set[int] = set()
    asked = 0
    for i, record in enumerate(records):
        if isinstance(record, Request):
            asked = i
        elif isinstance(record, Resumed):
            dropped.update(range(asked + 1, i))
    return dropped


def spawn_grant(grants: list[str]) -> int:
    """The children a child may start in turn, from its grants as recorded (`spawn:N`; none without one)."""
    return next((int(g.partition(":")[2]) for g in grants if g.startswith("spawn:") and g.partition(":")[2].isdigit()), 0)


def ran_for(tape: Records) -> float:
    """Seconds the session ran: from its start, and from each resume, to the last record before the next one."""
    total, began, last = 0.0, None, None
    for record in tape:
        if isinstance(record, (Meta, Resumed)):
            if began is not None and last is not None:
                total += last - began
            began = record.t
        last = record.t
    if began is not None and last is not None:
        total += last - began
    return total

"""Which tool call a tape's record belongs to: the one walk over a tape's responses and their answers.

A response lists the tool calls the model made; the box runs them in order and reports each as it ends (a
`tool`, `tool_error`, `exec` or `exit` record), so the call running at any moment is the first of the last
response's calls not answered yet. A child the box starts (`spawn`) was started by that call. The view says
from it how a child was started (sessions_view.how_spawned) and the traces put each child under its tool
call's span (traces.py); both walk the tape through `ToolCalls`.

Tapes are read as found (records as `read_tape` gives them, or any JSON objects): a call whose fields have the
wrong type keeps only the fields that fit, never a crash, since the model's words and a box's events are on it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

#: The records that answer the next call of the response before them.
ANSWERS = ("tool", "tool_error", "exec", "exit")


@dataclass(frozen=True)
class Call:
    """One tool call of a response: its id, its function's name, and its arguments as the model wrote them."""

    id: str | None
    name: str | None
    arguments: str | None = None

    def parsed(self) -> dict[str, Any]:
        """The arguments as a JSON object; {} when they are none (the model's text need not be JSON, nor an object)."""
        try:
            value = json.loads(self.arguments or "{}")
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}


def calls_of(message: Any) -> list[Call]:
    """The tool calls a response's message made, in order."""
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    found = []
    for item in calls if isinstance(calls, list) else []:
        call: dict[str, Any] = item if isinstance(item, dict) else {}
        function: dict[str, Any] = call["function"] if isinstance(call.get("function"), dict) else {}
        found.append(Call(_text(call.get("id")), _text(function.get("name")), _text(function.get("arguments"))))
    return found


class ToolCalls:
    """A walk over one tape, record by record: `step` says which call each record belongs to."""

    def __init__(self) -> None:
        #: The last response's calls not answered yet; the first is the one running.
        self.waiting: list[Call] = []

    def step(self, record: Any) -> Call | None:
        """The call `record` answers (an answer), or the one running when it was written (a spawn); else None.

        A response starts its calls afresh: those of an earlier one that were never answered are dropped
        (take them first with `unanswered`)."""
        kind = record.get("kind") if isinstance(record, dict) else None
        if kind == "response":
            self.waiting = calls_of(record.get("message"))
        elif kind in ANSWERS:
            return self.waiting.pop(0) if self.waiting else None
        elif kind == "spawn":
            return self.waiting[0] if self.waiting else None
        return None

    def unanswered(self) -> list[Call]:
        """The calls still waiting for an answer, which no longer will (a new turn began, or the tape ended)."""
        left, self.waiting = self.waiting, []
        return left


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None

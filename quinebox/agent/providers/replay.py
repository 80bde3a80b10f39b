"""Answers from a recorded tape, in order, failing loudly where the new run diverges.

A request diverges when what the agent sends (its conversation so far, tool
results included) differs from what it sent at the same point of the
recording: from there the recorded answers would be answers to another question.
"""

from __future__ import annotations

import hashlib
import json
import threading
from typing import Any

from quinebox.agent.providers.base import Completion, ProviderError
from quinebox.agent.records import Request, Response, as_dict
from quinebox.agent.store import read_records
from quinebox.errors import ErrorKind, QuineboxError


def digest(messages: list[dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(messages, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


class ReplayProvider:
    def __init__(self, session: str, *, start: int = 0):
        """`start`: the model calls already answered (a resumed session's)."""
        self.name = f"replay:{session}"
        tape = read_records(session)
        if not tape:
            raise QuineboxError(f"no tape for session {session!r}: `quinebox ls` lists sessions", kind=ErrorKind.NOT_FOUND, session=session)
        answers = {r.turn: r for r in tape.of(Response)}  # paired by turn, never by position
        asked = {r.turn: r for r in tape.of(Request)}  # a turn asked again after a resume: the last time, which was answered
        self._pairs = [(asked[turn], answers[turn]) for turn in sorted(asked) if turn in answers]
        self._next = start
        self._lock = threading.Lock()

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        with self._lock:
            index = self._next
            self._next += 1
        if index >= len(self._pairs):
            raise ProviderError(f"replay diverged: the recording has {len(self._pairs)} model calls and this run asked for more")
        request, response = self._pairs[index]
        if request.digest != digest(messages):
            raise ProviderError(f"replay diverged at model call {index + 1} (turn {request.turn}): the agent's conversation differs from the recording")
        message = as_dict(response.message)
        return Completion(message=message, usage=dict(response.usage), finish_reason=response.finish_reason)

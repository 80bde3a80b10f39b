"""A scripted model: turns from a YAML file, for demos, docs and tests. No network, no key.

    turns:
      - sh: "wc -l <&3 >&4"              # a tool call, in short
      - say: "thinking out loud"          # a reply without a tool call
      - tool: sh                          # the long form, any tool and arguments
        args: {command: "ls", timeout: 5}
      - exec: "note to my next self"
      - fork: {mode: wait, children: [{mission: "…", material: "…", model: "script:child.yaml"}]}
      - exit: success                     # or {status: failure, reason: "..."}

Each model call takes the next turn, across exec cycles. Usage is estimated
(4 characters a token) so budgets behave as with a real model.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from quinebox.agent.providers.base import Completion, ProviderError
from quinebox.documents import read_yaml
from quinebox.errors import ErrorKind, QuineboxError

SHORTHANDS = {"sh": "command", "exec": "note"}


def _call(index: int, name: str, args: Any) -> dict[str, Any]:
    arguments = args if isinstance(args, str) else json.dumps(args)
    return {"id": f"call_{index}", "type": "function", "function": {"name": name, "arguments": arguments}}


def turn_message(index: int, turn: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": turn.get("say")}
    if "tool" in turn:
        message["tool_calls"] = [_call(index, turn["tool"], turn.get("args", {}))]
    for name, field in SHORTHANDS.items():
        if name in turn:
            message["tool_calls"] = [_call(index, name, {field: turn[name]})]
    if "fork" in turn:
        message["tool_calls"] = [_call(index, "fork", turn["fork"])]
    if "exit" in turn:
        value = turn["exit"]
        message["tool_calls"] = [_call(index, "exit", value if isinstance(value, dict) else {"status": value})]
    return message


class ScriptProvider:
    def __init__(self, path: str, *, start: int = 0):
        """`start`: the turns already taken (a resumed session's model calls so far)."""
        self.name = f"script:{path}"
        doc = read_yaml(path, "model script")
        turns = doc.get("turns") if isinstance(doc, dict) else None
        if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
            raise QuineboxError(f"bad model script {path}: expected 'turns:' as a list of mappings", kind=ErrorKind.BAD_INPUT, path=path)
        self._messages = [turn_message(i, t) for i, t in enumerate(turns)]
        self._next = start
        self._lock = threading.Lock()

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        with self._lock:
            if self._next >= len(self._messages):
                raise ProviderError(f"the model script has no turn {self._next + 1}")
            message = self._messages[self._next]
            self._next += 1
        prompt = len(json.dumps(messages)) // 4
        completion = max(1, len(json.dumps(message)) // 4)
        return Completion(message=message, usage={"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}, finish_reason="tool_calls")

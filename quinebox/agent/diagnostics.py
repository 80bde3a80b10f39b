"""What a running agent shows on stderr: turns and tool calls as they happen.

On a terminal the lines are coloured (rich); piped, they are plain lines a
log can keep. Either way they are diagnostics, never part of the deliverable.
"""

from __future__ import annotations

import sys
from typing import Any

from quinebox.agent.session import View

WIDTH = 100


def _short(text: Any, width: int = WIDTH) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= width else line[: width - 1] + "…"


def describe(event: dict[str, Any]) -> tuple[str, str] | None:
    """(style, text) for one event, or None for events not worth a line."""
    name, turn = event.get("event"), event.get("turn")
    if name == "response":
        message = event.get("message") or {}
        calls = message.get("tool_calls") or []
        said = f" “{_short(message['content'], 60)}”" if message.get("content") else ""
        if not calls:
            return "yellow", f"turn {turn}: no tool call{said}"
        shown = ", ".join(f"{c['function']['name']}({_short(c['function'].get('arguments', ''), 70)})" for c in calls)
        return "cyan", f"turn {turn}: {shown}{said}"
    if name == "tool":
        first = (event.get("result") or "").splitlines()[0:1]
        return ("green" if event.get("exit_code") == 0 else "red"), f"turn {turn}:   → {first[0] if first else ''}"
    if name == "tool_error":
        return "red", f"turn {turn}:   → {_short(event.get('error'))}"
    if name == "exec":
        return "magenta", f"turn {turn}: exec → cycle {event.get('cycle')}: {_short(event.get('note'), 80)}"
    if name == "exit":
        reason = f": {_short(event.get('reason'))}" if event.get("reason") else ""
        return ("green" if event.get("status") == "success" else "red"), f"turn {turn}: exit {event.get('status')}{reason}"
    if name == "terminated":
        return "red", f"turn {turn}: terminated: {event.get('termination')}"
    return None


def _prefix(event: dict[str, Any]) -> str:
    return f"quinebox[{str(event.get('session', ''))[:6]}]"


def make_view(*, quiet: bool) -> View | None:
    if quiet:
        return None
    if sys.stderr.isatty():
        from rich.console import Console
        from rich.text import Text

        console = Console(stderr=True, highlight=False, soft_wrap=True)

        def rich_view(event: dict[str, Any]) -> None:
            line = describe(event)
            if line:
                console.print(Text(_prefix(event) + " ", style="dim") + Text(line[1], style=line[0]))

        return rich_view

    def plain_view(event: dict[str, Any]) -> None:
        line = describe(event)
        if line:
            print(f"{_prefix(event)} {line[1]}", file=sys.stderr, flush=True)

    return plain_view

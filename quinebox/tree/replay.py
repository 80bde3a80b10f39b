"""`quinebox replay`: run a recorded mission again against its recorded answers, and say where it diverges.

A CI job can regression-test a mission this way: exit 0 when the tool calls
and the outcome match the tape, 1 where they do not.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from quinebox.agent.diagnostics import make_view
from quinebox.agent.records import as_dict
from quinebox.agent.resumption import superseded
from quinebox.agent.store import read_records, read_tape
from quinebox.agent.tapes import ACTIONS, find
from quinebox.tree.supervisor import start_agent


def actions(tape: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    out = []
    for record in tape:
        if record["kind"] in ACTIONS:
            out.append((record["kind"], record.get("name"), json.dumps(record.get("args"), sort_keys=True), record.get("exit_code"), record.get("status")))
    return out


def replay(session: str, *, quiet: bool) -> int:
    """Re-run a recorded mission (same grants, this process's stdin as material) against its tape. A resumed
    session's tape is compared without what its lost turns did before they ran again (resumption.superseded)."""
    row = find(session)
    records = list(read_records(row.id))
    dropped = superseded(records)
    recorded = [as_dict(r) for i, r in enumerate(records) if i not in dropped]
    meta = recorded[0] if recorded and recorded[0]["kind"] == "meta" else {}
    agent = start_agent(
        row.mission,
        model=f"replay:{row.id}",
        grants=meta.get("grants", []),
        image=meta.get("image"),
        workdir=meta.get("workdir"),
        view=make_view(quiet=quiet),
    )
    agent.wait()
    replayed = read_tape(agent.session.session)
    before, after = actions(recorded), actions(replayed)
    for i, (old, new) in enumerate(zip(before, after, strict=False)):
        if old != new:
            print(f"quinebox: replay diverged at action {i + 1}: recorded {old[:3]}, replayed {new[:3]}", file=sys.stderr)
            return 1
    if len(before) != len(after):
        print(f"quinebox: replay diverged: {len(before)} actions recorded, {len(after)} replayed", file=sys.stderr)
        return 1
    old_out: dict[str, Any] = next((r for r in reversed(recorded) if r["kind"] == "outcome"), {})
    new_out = agent.outcome or {}
    if (old_out.get("exit_code"), old_out.get("termination")) != (new_out.get("exit_code"), new_out.get("termination")):
        print(
            f"quinebox: replay diverged in its outcome: recorded exit {old_out.get('exit_code')} ({old_out.get('termination')}), "
            f"replayed exit {new_out.get('exit_code')} ({new_out.get('termination')})",
            file=sys.stderr,
        )
        return 1
    print(f"quinebox: replay of {row.id} as {agent.session.session} matches: {len(after)} actions, exit {new_out.get('exit_code')} ({new_out.get('termination')})", file=sys.stderr)
    return 0

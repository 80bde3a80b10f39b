"""Reading sessions back: `ls`, `show`, `logs` and `tree` (`replay` runs one again: tree/replay.py)."""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime
from typing import Any

from quinebox.agent.store import Index, SessionRow, follow_tape, read_tape
from quinebox.errors import ErrorKind, QuineboxError

#: Tape records that say what the agent did, compared by `replay`.
ACTIONS = ("tool", "tool_error", "exec", "exit", "terminated")


def find(session: str) -> SessionRow:
    index = Index()
    try:
        row = index.get(session)
        if row is None:
            raise not_found(index, session)
    finally:
        index.close()
    return row


def missing(index: Index, session: str) -> str:
    """The one line for a session `index` has no row of: pruned (and when), or none such."""
    pruned = index.pruned(session)
    if pruned is not None:
        at = datetime.fromtimestamp(pruned[1]).strftime("%Y-%m-%d %H:%M:%S")
        return f"session {pruned[0]} was pruned at {at} (`quinebox prune`): its tape and world are gone"
    return f"no session {session!r} (or more than one starts so): `quinebox ls` lists them"


def not_found(index: Index, session: str) -> QuineboxError:
    """The error for a session `index` has no row of: NOT_FOUND, with `session` as asked and, if it was pruned, the id
    it had and when (`pruned_at`, seconds since the epoch)."""
    pruned = index.pruned(session)
    facts = {"pruned": pruned[0], "pruned_at": pruned[1]} if pruned is not None else {}
    return QuineboxError(missing(index, session), kind=ErrorKind.NOT_FOUND, session=session, **facts)


def print_sessions(limit: int) -> None:
    from rich.console import Console
    from rich.table import Table

    index = Index()
    rows = index.recent(limit)
    interrupted = index.interrupted(rows)
    index.close()
    table = Table(box=None, pad_edge=False)
    for column in ("ID", "STARTED", "EXIT", "TERMINATION", "TURNS", "TOKENS", "MISSION"):
        table.add_column(column, overflow="fold")
    for row in rows:
        started = datetime.fromtimestamp(row.started).strftime("%Y-%m-%d %H:%M:%S")
        exit_code = ("interrupted" if row.id in interrupted else "running") if row.ended is None else str(row.exit_code)
        table.add_row(row.id, started, exit_code, row.termination or "", str(row.turns), str(row.tokens), " ".join(row.mission.split())[:60])
    Console(width=None if sys.stdout.isatty() else 200).print(table)


def _label(row: SessionRow, depth: int, interrupted: set[str]) -> str:
    if row.ended is None:
        status = "interrupted" if row.id in interrupted else "running"
        duration = time.time() - row.started
    else:
        status = f"exit {row.exit_code} ({row.termination})"
        duration = row.ended - row.started
    mission = " ".join(row.mission.split())[:70]
    return f"{row.id}  {status}  {duration:.1f} s  {row.turns} turns  {row.tokens} tokens  depth {depth}  {mission}"


def print_tree(session: str) -> None:
    """A session and every session it started, live or finished."""
    from rich.console import Console
    from rich.markup import escape
    from rich.tree import Tree

    root = find(session)
    index = Index()
    try:
        interrupted = index.interrupted(index.subtree(root.id))
        tree = Tree(escape(_label(root, 0, interrupted)))
        pending = [(root, tree, 0)]
        while pending:
            row, branch, depth = pending.pop(0)
            for child in index.children(row.id):
                pending.append((child, branch.add(escape(_label(child, depth + 1, interrupted))), depth + 1))
    finally:
        index.close()
    Console(width=None if sys.stdout.isatty() else 200, highlight=False).print(tree)


def render(record: dict[str, Any]) -> str:
    """One tape record as one readable line."""
    kind = record["kind"]
    stamp = time.strftime("%H:%M:%S", time.localtime(record.get("t", 0)))
    fields = {k: v for k, v in record.items() if k not in ("t", "kind")}
    if kind == "request":
        fields["messages"] = f"{len(fields.get('messages', []))} new"
    if kind == "response":
        message = fields.pop("message", {})
        calls = [f"{c['function']['name']}({c['function'].get('arguments', '')})" for c in message.get("tool_calls") or []]
        fields["calls"] = calls or None
        if message.get("content"):
            fields["content"] = message["content"]
    if kind == "tool":
        fields["result"] = " ".join(str(fields.get("result", "")).split())[:160]
    text = json.dumps(fields, ensure_ascii=False, default=str)
    return f"{stamp} {kind:<15} {text}"


def print_logs(session: str, *, follow: bool) -> None:
    row = find(session)
    records = follow_tape(row.id) if follow and row.ended is None else read_tape(row.id)
    for record in records:
        print(render(record), flush=True)


def _egress(record: dict[str, Any]) -> str:
    if not record.get("allowed"):
        return f"refused: {record.get('why')}"
    return (f"{record.get('host')}:{record.get('port')} ({record.get('address')}) allowed by {record.get('rule')}, "
            f"{record.get('up', 0)} bytes up, {record.get('down', 0)} down")


def print_show(session: str) -> None:
    row = find(session)
    tape = read_tape(row.id)
    print(f"session   {row.id}" + (f"  (child of {row.parent})" if row.parent else ""))
    print(f"mission   {row.mission}")
    print(f"model     {row.model}")
    meta = tape[0] if tape and tape[0]["kind"] == "meta" else {}
    if meta.get("grants"):
        print(f"grants    {' '.join(meta['grants'])}")
    origin = meta.get("forked_from")
    if origin:
        print(f"forked    from {origin['session']} at turn {origin['turn']} (world revision {origin['revision']})")
    for record in tape:
        kind = record["kind"]
        if kind == "response":
            for call in record["message"].get("tool_calls") or []:
                print(f"turn {record['turn']:>3}  {call['function']['name']} {call['function'].get('arguments', '')}")
            if not record["message"].get("tool_calls"):
                print(f"turn {record['turn']:>3}  (no tool call) {record['message'].get('content') or ''}")
        elif kind == "tool":
            print(f"          → exit {record.get('exit_code')}")
        elif kind in ("tool_error", "provider_error"):
            print(f"          → {record.get('error') or record.get('message')}")
        elif kind == "exec":
            print(f"          exec → cycle {record.get('cycle')}")
        elif kind == "revision":
            print(f"          world revision {record['rev']}: {record['files']} path(s), {record['bytes']} bytes")
        elif kind == "egress":
            print(f"egress    {_egress(record)}")
        elif kind == "resumed":
            again = "its recorded answer taken again" if record.get("answered") else "the model asked again"
            print(f"resumed   at turn {record['turn']} ({again}), world revision {record.get('revision')}, {record['material']} bytes of material passed over")
    outcome = next((r for r in reversed(tape) if r["kind"] == "outcome"), None)
    if outcome:
        print(f"outcome   exit {outcome['exit_code']} ({outcome['termination']}), {outcome['turns']} turns, {outcome['tokens']} tokens, {outcome['duration_s']} s")
    elif _interrupted(row):
        print(f"outcome   (interrupted: its process was lost; `quinebox resume {row.id}` goes on with it)")
    else:
        print("outcome   (still running)")


def _interrupted(row: SessionRow) -> bool:
    index = Index()
    try:
        return row.id in index.interrupted([row])
    finally:
        index.close()

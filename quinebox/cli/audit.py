"""Commands for authority on the record: `audit`, `audit verify`, `approvals`, `approve`, `deny`, `revoke`."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

import typer

from quinebox.cli.app import app, reported, say

audit_app = typer.Typer(help="The audit log: every authority decision, hash-chained (`audit verify` checks the chain).")
app.add_typer(audit_app, name="audit")


def _since(text: str) -> str:
    """An ISO time, or a duration back from now (10m, 2h) → an ISO time in UTC to compare records' times with."""
    from quinebox.errors import GrantError
    from quinebox.grants import parse_duration

    try:
        return datetime.fromtimestamp(time.time() - parse_duration(text), UTC).isoformat(timespec="microseconds")
    except GrantError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise typer.BadParameter(f"{text!r} is neither a time (2026-11-30T18:00) nor a duration back from now (10m, 2h)") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).astimezone(UTC).isoformat(timespec="microseconds")


def _facts(facts: dict[str, Any]) -> str:
    from quinebox.audit.prompt import escaped

    return " ".join(f"{name}={escaped(json.dumps(value) if not isinstance(value, str) else value, 160)}" for name, value in facts.items())


@audit_app.callback(invoke_without_command=True)
def audit(
    ctx: typer.Context,
    session: str | None = typer.Option(None, "--session", help="Only this session's records (or those of sessions starting so)."),
    since: str | None = typer.Option(None, "--since", metavar="TIME", help="Only records since this time (ISO) or this long ago (10m, 2h)."),
    json_out: bool = typer.Option(False, "--json", help="One record per line, as stored."),
) -> None:
    if ctx.invoked_subcommand:
        return
    from quinebox.agent.store import Index
    from quinebox.audit.log import AuditLog

    after = _since(since) if since else ""
    index = Index()
    pruned = index.every_pruned()  # its records stay; they point at data `quinebox prune` took
    index.close()
    for record in AuditLog().records():
        if session and not str(record.get("session") or "").startswith(session):
            continue
        if after and str(record.get("time", "")) < after:
            continue
        if json_out:
            print(json.dumps(record, sort_keys=True))
        else:
            named = str(record.get("session") or "-") + (" (pruned)" if record.get("session") in pruned else "")
            print(f"{record.get('seq'):>6} {str(record.get('time', ''))[:23]} {named:<12} {record.get('kind'):<18} {_facts(record.get('facts') or {})}")


@audit_app.command("verify", help="Check the chain: exit 0 when intact, 1 naming the first record that is not what was written.")
def verify_command() -> None:
    from quinebox.audit.log import verify

    with reported():
        verdict = verify()
    print(verdict.line())
    raise typer.Exit(0 if verdict.intact else 1)


@app.command("approvals", help="Requests waiting for a person, oldest first (`approve ID` / `deny ID` answers one).")
def approvals_command(
    json_out: bool = typer.Option(False, "--json", help="One JSON object per request."),
    wait: bool = typer.Option(False, "--wait", help="Wait until at least one request is pending, then list."),
    remembered: bool = typer.Option(False, "--remembered", help="List the remembered always/never decisions instead."),
) -> None:
    from quinebox.audit import approvals

    if remembered:
        for entry in approvals.remembered():
            print(
                json.dumps(entry, sort_keys=True) if json_out
                else f"{entry['decision']:<5} {entry['rule']}  ({entry.get('project') or 'global'}; {entry.get('by')} at {entry.get('at')})"
            )
        return
    entries = approvals.pending()
    while wait and not entries:
        time.sleep(0.2)
        entries = approvals.pending()
    for entry in entries:
        if json_out:
            print(json.dumps({k: entry[k] for k in ("id", "session", "kind", "subject", "facts", "since", "digest")}, sort_keys=True))
        else:
            print(f"{entry['id']}  {entry['session']}  {entry['since']}  {_facts({'wants': entry['subject']})}  {_facts(entry.get('facts') or {})}")


@app.command("approve", help="Allow a pending request: once (default), for the rest of its box's session, or always (remembered).")
def approve_command(
    request: str = typer.Argument(..., metavar="ID", help="The request's id (or a unique prefix), as `quinebox approvals` lists it."),
    session: bool = typer.Option(False, "--session", help="Allow the same request for the rest of the box's session."),
    always: bool = typer.Option(False, "--always", help="Remember: allow it without asking from now on, in this project directory."),
    globally: bool = typer.Option(False, "--global", help="With --always: in every directory, not just the run's."),
) -> None:
    if session and always:
        say("give --session or --always, not both")
        raise typer.Exit(2)
    _answer(request, allow=True, scope="always" if always else "session" if session else "once", globally=globally)


@app.command("deny", help="Deny a pending request (--always: and remember to deny it from now on).")
def deny_command(
    request: str = typer.Argument(..., metavar="ID", help="The request's id (or a unique prefix)."),
    always: bool = typer.Option(False, "--always", help="Remember: deny it without asking from now on, in this project directory."),
    globally: bool = typer.Option(False, "--global", help="With --always: in every directory."),
) -> None:
    _answer(request, allow=False, scope="always" if always else "deny", globally=globally)


def _answer(request: str, *, allow: bool, scope: str, globally: bool) -> None:
    from quinebox.audit import approvals

    with reported():
        entry = approvals.decide(request, allow=allow, scope=scope, globally=globally)
    say(f"{'approved' if allow else 'denied'} {entry['id']}: {entry['subject']}")


@app.command("revoke", help="Forget a remembered always/never decision (RULE as `approvals --remembered` shows it).")
def revoke_command(rule: str = typer.Argument(..., help="The remembered rule, e.g. 'net:example.com:443'.")) -> None:
    from quinebox.audit import approvals

    gone = approvals.revoke(rule)
    if not gone:
        say(f"nothing remembered for {rule!r}: `quinebox approvals --remembered` lists what is")
        raise typer.Exit(1)
    say(f"revoked {gone} remembered decision(s) for {rule}")

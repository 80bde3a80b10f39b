"""Requests waiting for a person, their decisions, and what was decided for good: in the state dir, so no process holds them.

    audit/pending/<id>.json    a request a box is waiting on (written by the quinebox process it asked)
    audit/decided/<id>.json    the decision for it, from `quinebox approve`/`deny` (read, then removed, by the asker)
    audit/remembered.json      "always" and "never" decisions: the rule, for which project, who, when

A box never reaches the state dir, so nothing here can be approved from inside
one. The asking process waits for whichever comes first: a person at its
terminal, a decision file from any other process (an approver may die and be
started again: the request is still pending), or its deadline, which denies.
Every question and answer goes to the audit log. All of it is the user's alone,
whatever the umask: dirs 0700, files 0600 (state.py).
"""

from __future__ import annotations

import fcntl
import getpass
import json
import os
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from quinebox.audit import log
from quinebox.audit.asks import Asks
from quinebox.audit.prompt import Terminal
from quinebox.audit.request import Request
from quinebox.errors import QuineboxError
from quinebox.processes import owner_alive, owner_id
from quinebox.state import private_dir, private_file, private_write

#: What a person may answer: allow this request only, for the rest of the box's session, or always; or deny.
SCOPES = ("once", "session", "always")
POLL_S = 0.1


@dataclass(frozen=True)
class Decision:
    allowed: bool
    scope: str  # once, session or always; "deny" when refused
    by: str


def _dir(name: str) -> Path:
    path = log.audit_dir() / name
    private_dir(path)
    return path


def _write(path: Path, value: dict[str, Any] | list[dict[str, Any]]) -> None:
    private_write(path, log.canonical(value))


def _asker(entry: dict[str, Any]) -> str | None:
    """The owner id (`host:pid:start`) of the process waiting on a pending request, so a reused pid never keeps it.

    A record from before owners were written carries only its asker's pid: it is read as that pid with its start
    unknown, i.e. as whichever process has the pid now, so it stays pending while that pid runs, as it did then.
    A record with neither is none of ours."""
    owner, pid = entry.get("owner"), entry.get("pid")
    if isinstance(owner, str):
        return owner
    return owner_id(pid) if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None


def pending() -> list[dict[str, Any]]:
    """Requests still waiting, oldest first; one whose asker is gone is dropped."""
    found = []
    for path in sorted(_dir("pending").glob("*.json")):
        try:
            entry = json.loads(path.read_bytes())
        except (OSError, ValueError):
            continue
        asker = _asker(entry) if isinstance(entry, dict) else None
        if asker is None or not owner_alive(asker):
            path.unlink(missing_ok=True)
            continue
        found.append(entry)
    return sorted(found, key=lambda e: e.get("since", ""))


def decide(prefix: str, *, allow: bool, scope: str, globally: bool = False, by: str = "cli") -> dict[str, Any]:
    """Answer a pending request (by id or a unique prefix of one) from outside the asking process; `by` says through what."""
    matches = [e for e in pending() if str(e.get("id", "")).startswith(prefix)] if prefix else []
    if len(matches) != 1:
        what = "no pending request" if not matches else f"{len(matches)} pending requests"
        raise QuineboxError(f"{what} with id {prefix!r}: `quinebox approvals` lists them")
    entry = matches[0]
    answer = {"id": entry["id"], "digest": entry["digest"], "allow": allow, "scope": scope, "global": globally, "by": f"{by}:{_who()}"}
    _write(_dir("decided") / f"{entry['id']}.json", answer)
    return entry


def _who() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}(pid {os.getpid()})"


# -- remembered decisions ------------------------------------------------------------------------


def remembered() -> list[dict[str, Any]]:
    try:
        entries = json.loads((log.audit_dir() / "remembered.json").read_bytes())
    except (OSError, ValueError):
        return []
    return entries if isinstance(entries, list) else []


def _update(change: Any) -> Any:
    """Change the remembered rules under a lock, so two deciders never lose each other's rule."""
    home = log.audit_dir()
    private_dir(home)
    path = home / "remembered.json"
    with open(private_file(home / "remembered.lock", os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        entries = remembered()
        result = change(entries)
        _write(path, entries)
    return result


def remember(subject: str, *, allow: bool, project: str | None, by: str) -> None:
    entry = {"rule": subject, "decision": "allow" if allow else "deny", "project": project, "by": by,
             "at": datetime.now(UTC).isoformat(timespec="seconds")}
    _update(lambda entries: entries.append(entry))


def revoke(rule: str) -> int:
    """Forget every remembered decision for `rule`; how many there were."""

    def drop(entries: list[dict[str, Any]]) -> int:
        kept = [e for e in entries if e.get("rule") != rule]
        gone = len(entries) - len(kept)
        entries[:] = kept
        return gone

    gone = int(_update(drop))
    if gone:
        log.record("approval_revoked", None, rule=rule, count=gone, by=f"cli:{_who()}")
    return gone


def lookup(subject: str, project: str) -> dict[str, Any] | None:
    """The remembered decision for `subject` here; a "deny" wins over an "allow"."""
    entries = [e for e in remembered() if e.get("rule") == subject and e.get("project") in (None, project)]
    return next((e for e in entries if e.get("decision") == "deny"), entries[0] if entries else None)


# -- asking ------------------------------------------------------------------------------------


class Approver:
    """The root process's side of asking: one per tree, one question on its terminal at a time."""

    def __init__(self, asks: Asks, *, terminal: bool = True):
        """`terminal` False: never put a question on this process's terminal, only to `quinebox approve`."""
        self.asks = asks
        self._session_allowed: set[tuple[str, str]] = set()
        self._terminal_lock = threading.Lock()
        self._terminal: Terminal | None = None
        self._terminal_opened = not terminal

    def decide(self, request: Request, time_left: float | None = None) -> Decision:
        """Ask, wait and record; never longer than the ask timeout or the box's own time left."""
        known = lookup(request.subject, self.asks.project)
        if known is not None:
            return self._done(request, Decision(known["decision"] == "allow", "always", f"remembered ({known.get('by')} at {known.get('at')})"))
        if (request.session, request.subject) in self._session_allowed:
            return self._done(request, Decision(True, "session", "allowed earlier in this session"))
        wait = self.asks.timeout if time_left is None else min(self.asks.timeout, time_left)
        log.record("approval_asked", request.session, id=request.id, kind=request.kind, subject=request.subject, digest=request.digest, facts=request.facts)
        if wait <= 0:
            return self._done(request, Decision(False, "deny", "timeout (--ask-timeout 0)"))
        path = _dir("pending") / f"{request.id}.json"
        _write(path, {"id": request.id, "session": request.session, "kind": request.kind, "subject": request.subject, "facts": request.facts,
                      "digest": request.digest, "owner": owner_id(), "since": datetime.now(UTC).isoformat(timespec="seconds"),
                      "deadline": time.time() + wait})
        try:
            decision = self._await(request, time.monotonic() + wait)
        finally:
            path.unlink(missing_ok=True)
            (_dir("decided") / f"{request.id}.json").unlink(missing_ok=True)
        return self._done(request, decision)

    def _done(self, request: Request, decision: Decision) -> Decision:
        log.record("approval_decided", request.session, id=request.id, subject=request.subject, allowed=decision.allowed, scope=decision.scope, by=decision.by)
        if decision.allowed and decision.scope == "session":
            self._session_allowed.add((request.session, request.subject))
        return decision

    def _await(self, request: Request, deadline: float) -> Decision:
        terminal, shown = None, False
        try:
            while True:
                answer = self._answered(request)
                if answer is not None:
                    if shown and terminal is not None:
                        terminal.say(f"decided elsewhere: {'allowed ' + answer.scope if answer.allowed else 'denied'} by {answer.by}")
                    return answer
                left = deadline - time.monotonic()
                if left <= 0:
                    if shown and terminal is not None:
                        terminal.say("no answer in time: denied")
                    return Decision(False, "deny", "timeout")
                if not shown:
                    terminal = self._claim_terminal()
                    if terminal is None:
                        time.sleep(min(POLL_S, left))
                        continue
                    terminal.ask(request, left)
                    shown = True
                assert terminal is not None
                scope = terminal.answer(min(POLL_S, left))
                if scope is not None:
                    if scope == "always":
                        remember(request.subject, allow=True, project=self.asks.project, by="terminal")
                    return Decision(scope != "deny", scope, "terminal")
        finally:
            if shown:
                self._terminal_lock.release()

    def _claim_terminal(self) -> Terminal | None:
        """This process's terminal, when it has one that is not its stdin, and no other question is on it."""
        if not self._terminal_opened:
            self._terminal_opened = True
            self._terminal = Terminal.open()
        if self._terminal is None or not self._terminal_lock.acquire(timeout=POLL_S):
            return None
        return self._terminal

    def _answered(self, request: Request) -> Decision | None:
        path = log.audit_dir() / "decided" / f"{request.id}.json"
        try:
            answer = json.loads(path.read_bytes())
        except (OSError, ValueError):
            return None
        path.unlink(missing_ok=True)
        if answer.get("digest") != request.digest:
            return None  # a decision for some other request under this id is no decision for this one
        allow, scope, by = bool(answer.get("allow")), str(answer.get("scope")), str(answer.get("by", "cli"))
        if scope not in SCOPES:
            scope = "deny" if not allow else "once"
        if scope == "always" or (not allow and answer.get("scope") == "always"):
            remember(request.subject, allow=allow, project=None if answer.get("global") else self.asks.project, by=by)
        return Decision(allow, scope if allow else "deny", by)

"""Everything the view can show, in one place: what the server routes to and what an export walks.

Each topic the page can follow has a stamp, a cheap value that changes when what the topic shows
changes; the event stream compares stamps instead of reading whole records.
"""

from __future__ import annotations

from typing import Any

from quinebox.view import runs_view, worlds_view
from quinebox.view.audit_view import AuditTail, pending, pending_stamp
from quinebox.view.redact import Redactor
from quinebox.view.sessions_view import Sessions


class Catalog:
    def __init__(self, redactor: Redactor | None = None):
        self.redactor = redactor or Redactor()
        self.audit = AuditTail()
        self.sessions = Sessions(self.audit, self._waiting, self.redactor.scrub)
        self.learn_secrets()

    def _waiting(self) -> set[str]:
        return {str(entry.get("session")) for entry in pending()}

    def pending(self) -> list[dict[str, Any]]:
        return pending()

    def learn_secrets(self) -> None:
        """Scrub the values of every variable a box was granted as a secret (by name) in what the audit log holds."""
        self.audit.refresh()
        self.redactor.learn(set(self.audit.secret_names))

    # -- worlds and runs, by the modules that read them ---------------------------------------------

    @staticmethod
    def world_revisions(session: str) -> dict[str, Any]:
        return worlds_view.revisions(session)

    def world_diff(self, session: str, rev: int) -> dict[str, Any]:
        return worlds_view.diff(session, rev, self.redactor.text)

    @staticmethod
    def world_files(session: str, rev: int) -> dict[str, Any]:
        return worlds_view.files(session, rev)

    @staticmethod
    def world_file(session: str, rev: int, path: str) -> dict[str, Any]:
        return worlds_view.file(session, rev, path)

    @staticmethod
    def runs() -> list[dict[str, Any]]:
        return runs_view.runs()

    def run(self, run_id: str) -> dict[str, Any]:
        return runs_view.run(run_id, self.redactor.text)

    # -- what changed -------------------------------------------------------------------------------

    def stamps(self, topics: list[str]) -> dict[str, Any]:
        """Each topic's stamp: sessions, session:<id>, tree:<id>, runs, run:<id>, audit, approvals."""
        self.learn_secrets()
        waiting = pending_stamp()
        version = self.sessions.stamp() if any(t.partition(":")[0] in ("sessions", "session", "tree") for t in topics) else None
        found: dict[str, Any] = {}
        for topic in topics:
            kind, _, subject = topic.partition(":")
            if kind == "sessions":
                found[topic] = (version, waiting)
            elif kind == "session":
                found[topic] = (self.sessions.stamp(subject), version, waiting)
            elif kind == "tree":
                found[topic] = (version, waiting, self.audit.stamp())
            elif kind in ("runs", "run"):
                found[topic] = runs_view.run_stamp()
            elif kind == "audit":
                found[topic] = (self.audit.stamp(), waiting)
            elif kind == "approvals":
                found[topic] = waiting
        return found

    def close(self) -> None:
        self.sessions.close()

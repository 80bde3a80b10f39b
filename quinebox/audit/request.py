"""A box's request that only a person may allow: the record the asker writes, the terminal shows and a decision binds to.

It lives apart from approvals.py (which asks, waits and remembers) so that prompt.py, which puts a request
on a terminal, and approvals.py, which uses that terminal, both import it and neither imports the other's
user.
"""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass, field
from typing import Any

from quinebox.audit import log


@dataclass(frozen=True)
class Request:
    """Something a box asked for that only a person may allow. `subject` is what "session" and "always" remember."""

    session: str
    kind: str  # "egress" or "child"
    subject: str
    facts: dict[str, Any]
    id: str = field(default_factory=lambda: os.urandom(4).hex())  # as secrets.token_hex

    @functools.cached_property
    def digest(self) -> str:
        """Binds an approval to this exact request: the same subject with other arguments is another request."""
        return hashlib.sha256(log.canonical({"session": self.session, "kind": self.kind, "subject": self.subject, "facts": self.facts})).hexdigest()

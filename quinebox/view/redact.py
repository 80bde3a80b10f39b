"""What must never leave the viewer's process: a secret's value, a provider key, the audit key.

Boxes never hold these (a secret is a placeholder in the box, the key stays in the broker), so the record
should not contain them either. The view still scrubs every byte it sends, as a second wall: a provider
that echoes its key into an error message, or a person who pastes one into a mission, must not put it on
a page, in an event stream or in an export.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

#: Environment variables that hold a credential by their name alone.
CREDENTIAL_NAME = re.compile(r"(API_KEY|_KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.IGNORECASE)
#: Shorter values are too likely to be ordinary words ("1", "true") to scrub everywhere.
MIN_LENGTH = 6
MARK = "[redacted]"


def secret_names(grants: Iterable[str]) -> set[str]:
    """The environment variables that `secret:NAME@HOST` grants name."""
    return {g.split(":", 1)[1].split("@", 1)[0] for g in grants if isinstance(g, str) and g.startswith("secret:") and "@" in g}


class Redactor:
    """Replaces known secret values in text; built from the viewer's own environment."""

    def __init__(self, environ: Mapping[str, str] | None = None, extra_names: Iterable[str] = ()):
        self._environ = dict(os.environ if environ is None else environ)
        self._values: set[str] = set()
        self._pattern: re.Pattern[str] | None = None
        names = {name for name in self._environ if CREDENTIAL_NAME.search(name)} | {"OPENAI_API_KEY"}
        self.learn(names | set(extra_names))
        key_file = self._environ.get("QUINEBOX_AUDIT_KEY_FILE")
        if key_file:
            try:
                with open(key_file, "rb") as f:
                    self._add(f.read().decode(errors="replace").strip())
            except OSError:
                pass

    def learn(self, names: Iterable[str]) -> None:
        """Scrub the values of these variables too (the names a session's secret grants hold)."""
        for name in names:
            self._add(self._environ.get(name, ""))

    def _add(self, value: str) -> None:
        if len(value) < MIN_LENGTH or value in self._values:
            return
        self._values.add(value)
        # Each value as it is, and as JSON writes it inside a string (quotes and backslashes escaped); longest first.
        forms = {f for v in self._values for f in (v, json.dumps(v)[1:-1], json.dumps(v, ensure_ascii=False)[1:-1])}
        self._pattern = re.compile("|".join(re.escape(f) for f in sorted(forms, key=len, reverse=True)))

    def text(self, text: str) -> str:
        return text if self._pattern is None else self._pattern.sub(MARK, text)

    def scrub(self, value: Any) -> Any:
        """`value` with every string in it scrubbed: for text that is cut afterwards, so no cut can leave half a secret."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {k: self.scrub(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.scrub(v) for v in value]
        return value

    def json(self, value: Any) -> str:
        """`value` as JSON text with every known secret replaced."""
        return self.text(json.dumps(value, ensure_ascii=False, default=str, separators=(",", ":")))

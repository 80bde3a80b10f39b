"""Putting a box's request to the person at the controlling terminal, so that the box cannot write the question.

Every fact a request carries came from a box: a mission, an argv, a host name.
Shown raw, escape sequences could clear the screen or move the cursor, and a
newline could start a line that looks like our own question. So every
control, format and separator character is shown as an escape (\\x1b, \\n,
\\u202e), long values are cut with their length said, and each fact sits on
one line behind a fixed margin; only the question itself starts a line.

The terminal is /dev/tty, never stdin: stdin is the box's material. When
stdin is that same terminal, a person typing material could answer by
accident, so no question is put there; `quinebox approve` decides instead.
"""

from __future__ import annotations

import os
import select
import unicodedata
from typing import Any

from quinebox.audit.request import Request

#: Longest value shown whole; a box's words are cut to this with their length said.
MAX_SHOWN = 240
QUESTION = "Allow? [o]nce, [s]ession, [a]lways, [d]eny"
ANSWERS = {"o": "once", "once": "once", "y": "once", "yes": "once", "s": "session", "session": "session",
           "a": "always", "always": "always", "d": "deny", "deny": "deny", "n": "deny", "no": "deny", "": "deny"}


def escaped(text: str, limit: int = MAX_SHOWN) -> str:
    """`text` with nothing a terminal would act on: controls, format characters and separators become escapes."""
    out = []
    for char in text[:limit]:
        category = unicodedata.category(char)
        if char == "\\":
            out.append("\\\\")
        elif category[0] in "CZ" and char != " ":
            code = ord(char)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(char)
    return "".join(out) + (f"…[{len(text)} chars]" if len(text) > limit else "")


def shown(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return " ".join(escaped(str(item)) for item in value) or "(none)"
    return escaped(str(value))


class Terminal:
    """The controlling terminal of this process, opened for questions and their answers."""

    def __init__(self, fd: int):
        self.fd = fd
        self._typed = b""

    @classmethod
    def open(cls) -> Terminal | None:
        """The controlling terminal; in a command server's worker, its client's (QUINEBOX_TERMINAL_FD)."""
        try:
            given = os.environ.get("QUINEBOX_TERMINAL_FD", "")
            fd = os.dup(int(given)) if given.isdigit() else os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
        except OSError:
            return None  # no controlling terminal: CI, a service, a pipeline under setsid
        try:
            same = os.isatty(0) and os.fstat(0).st_rdev == os.fstat(fd).st_rdev
        except OSError:
            same = False
        if same:
            os.close(fd)
            return None
        return cls(fd)

    def ask(self, request: Request, seconds: float) -> None:
        lines = [f"quinebox: box {escaped(request.session)} asks ({request.kind}, request {request.id}):", f"  | wants: {shown(request.subject)}"]
        lines += [f"  | {escaped(str(name))}: {shown(value)}" for name, value in request.facts.items()]
        lines.append(f"{QUESTION} (default deny, {int(seconds)} s; or `quinebox approve {request.id}` elsewhere) ")
        termios_flush(self.fd)  # before the question, never after: an answer typed once it shows must count
        self._typed = b""
        self._write("\r\n".join(lines))

    def answer(self, timeout: float) -> str | None:
        """The scope the person chose, once they pressed Enter; None while they have not."""
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return None
        chunk = os.read(self.fd, 256)
        if not chunk:
            return "deny"  # the terminal hung up
        self._typed += chunk
        if b"\n" not in self._typed and b"\r" not in self._typed:
            return None
        word = self._typed.splitlines()[0].decode(errors="replace").strip().lower()
        self._typed = b""
        if word in ANSWERS:
            return ANSWERS[word]
        self._write(f"please answer o, s, a or d. {QUESTION} ")
        return None

    def say(self, text: str) -> None:
        self._write(f"\r\nquinebox: {text}\r\n")

    def _write(self, text: str) -> None:
        try:
            os.write(self.fd, text.encode())
        except OSError:
            pass


def termios_flush(fd: int) -> None:
    """Drop what was typed before the question: an answer must come after it is asked."""
    import termios

    try:
        termios.tcflush(fd, termios.TCIFLUSH)
    except termios.error:
        pass

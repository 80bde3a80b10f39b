"""What the MCP server takes from a client: its limits, the check and cap of every argument, and the grants a box may get.

Nothing a client sends is trusted: each value is checked here before a tool uses it (a refusal is a `Refused`,
the one line that client reads), output is kept to a cap (`Capped`), and the grants asked for a box or a
mission are attenuated within the server's ceiling (grants.attenuate, as for a box's child), a request for
more being refused and recorded in the audit log as `child_refused`. Apart from the server (mcp_server.py) so that
every tool checks alike, and none of this needs the `mcp` package.
"""

from __future__ import annotations

import io
import os
import re
from dataclasses import replace
from pathlib import PurePosixPath
from typing import Any

from quinebox.audit import log
from quinebox.errors import GrantError
from quinebox.grants import Grants, attenuate, parse_duration, within

WORLD = "/world"
MAX_BOXES = 8
#: The most copies one fork_sandbox makes.
MAX_COPIES = 8
DEFAULT_TTL, MAX_TTL = 3600.0, 86400.0
DEFAULT_TIMEOUT, MAX_TIMEOUT = 120.0, 3600.0
DEFAULT_OUTPUT, MAX_OUTPUT = 64 << 10, 1 << 20
DEFAULT_READ, MAX_READ = 256 << 10, 4 << 20
MAX_WRITE = 8 << 20
DEFAULT_EXPORT, MAX_EXPORT = 4 << 20, 16 << 20
MAX_INPUT = 4 << 20
MAX_TEXT = 256 << 10
MAX_PATH = 4096
MAX_ENTRIES = 5000
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
IMAGE_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}$")
ENV_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


class Refused(Exception):
    """A tool's one-line failure, as the client reads it."""


def one_line(text: str, limit: int = 2000) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "…"


class Capped:
    """An output stream's first `cap` bytes, and how many came after them."""

    def __init__(self, cap: int):
        self.cap, self.kept, self.total = cap, 0, 0
        self.parts: list[bytes] = []

    def __call__(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.cap - self.kept
        if room > 0:
            self.parts.append(chunk[:room])
            self.kept += min(room, len(chunk))

    @property
    def data(self) -> bytes:
        return b"".join(self.parts)

    @property
    def cut(self) -> int:
        return self.total - self.kept


def shown(data: bytes, cut: int) -> str:
    text = data.decode("utf-8", errors="replace")
    return text + (f"\n[truncated: {cut} more bytes cut]" if cut else "")


# -- checking what a client sends ---------------------------------------------------------------

def text(value: Any, what: str, limit: int = MAX_TEXT, *, empty: bool = False) -> str:
    if not isinstance(value, str):
        raise Refused(f"{what} must be a string")
    if len(value) > limit:
        raise Refused(f"{what} is {len(value)} characters; the most is {limit}")
    if not empty and not value.strip():
        raise Refused(f"{what} is empty")
    return value


def number(value: Any, what: str, default: float, most: float) -> float:
    if value is None:
        return default
    if isinstance(value, str):
        try:
            value = parse_duration(value)
        except GrantError as exc:
            raise Refused(f"{what}: {exc}") from exc
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= most:
        raise Refused(f"{what} must be more than 0 and at most {most:g}")
    return float(value)


def size(value: Any, what: str, default: int, most: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= most:
        raise Refused(f"{what} must be a whole number from 1 to {most}")
    return value


def strings(value: Any, what: str, most: int = 256) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise Refused(f"{what} must be a list of strings")
    if len(value) > most or sum(map(len, value)) > MAX_TEXT:
        raise Refused(f"{what} is too long: at most {most} items and {MAX_TEXT} characters")
    if any("\0" in v for v in value):
        raise Refused(f"{what} may hold no NUL character")
    return value


def box_path(path: Any, roots: list[str]) -> str:
    """An absolute path in the box within `roots` (relative paths are /world's), checked as text; the box resolves links."""
    path = text(path, "path", MAX_PATH)
    if "\0" in path:
        raise Refused("path may hold no NUL character")
    if ".." in PurePosixPath(path).parts:
        raise Refused(f"path {path!r} holds '..': give it without")
    full = os.path.normpath(path if path.startswith("/") else f"{WORLD}/{path}")
    if not any(within(full, root) for root in roots):
        raise Refused(f"path {path!r} is outside the box's files ({', '.join(roots)})")
    return full


# -- the grants a box gets ----------------------------------------------------------------------

def held(ceiling: Grants) -> str:
    """The ceiling as a person reads it: env values left out."""
    return " ".join(g.split("=", 1)[0] if g.startswith("env:") else g for g in ceiling.format()) or "no grants"


def narrow(ceiling: Grants, asked: list[str], tool: str, *, cwd: str) -> Grants:
    """The grants a box gets: what the client asked for, within the server's `ceiling`; more is refused and recorded."""
    try:
        parsed = Grants.parse(asked, cwd=cwd)
    except GrantError as exc:
        raise Refused(str(exc)) from exc
    parsed = replace(parsed, mounts=tuple(replace(m, source=os.path.realpath(m.source)) for m in parsed.mounts))
    parent = replace(
        ceiling,
        mounts=tuple(replace(m, dest=m.source) for m in ceiling.mounts),  # a client names host paths
        spawn=(ceiling.spawn or 0) + 1,
        depth=(ceiling.depth or 0) + 1,
    )
    try:
        return attenuate(parent, parsed)
    except GrantError as exc:
        said = str(exc).replace("this box's", "this MCP server's").replace("this box ", "this MCP server ")
        why = f"{said} (this MCP server holds {held(ceiling)}; start `quinebox mcp -g ...` with more)"
        log.note("child_refused", None, by="mcp", tool=tool, request=asked, why=why)
        raise Refused(why) from exc


def lifetime(ceiling: Grants, value: Any, what: str, default: float, most: float) -> float:
    """Seconds a box or mission may last: `value` checked, and within the ceiling's time:N (more is refused and recorded)."""
    limit = min(most, ceiling.time) if ceiling.time else most
    seconds = number(value, what, min(default, limit), most)
    if seconds > limit:
        why = f"refused {what} {seconds:g}s: more than this MCP server's time:{limit:g}s"
        log.note("child_refused", None, by="mcp", request={what: value}, why=why)
        raise Refused(why)
    return seconds


class CappedFile(io.BytesIO):
    """A BytesIO that refuses to grow past `cap` (an export returned inline)."""

    def __init__(self, cap: int):
        super().__init__()
        self.cap = cap

    def write(self, data: Any) -> int:
        if self.tell() + len(data) > self.cap:
            raise Refused(f"the archive is more than {self.cap} bytes: give max_bytes (at most {MAX_EXPORT}) or a path to write it to")
        return super().write(data)

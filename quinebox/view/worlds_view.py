"""A session's world as the view shows it: its revisions, what each changed, and its files at any revision.

Read from the revision log and the object store only, never from a live world: the host only ever reads
what the tracker recorded, so a box cannot race the page with a link swapped in under it.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

from quinebox.worlds.history import print_diff
from quinebox.worlds.revisions import ObjectStore, RevisionLog, WorldError, changes, describe

#: Largest file shown as text on the page.
MAX_FILE = 256 << 10
#: Longest diff sent to the page.
MAX_DIFF = 512 << 10


def revisions(session: str) -> dict[str, Any]:
    keep = ("rev", "t", "turn", "what", "command", "files", "bytes", "base")
    return {"revisions": [{k: r.get(k) for k in keep if k in r} for r in RevisionLog(session).records()]}


def diff(session: str, rev: int, scrub: Callable[[str], str] = str) -> dict[str, Any]:
    """What `rev` changed since the revision before it: the changed paths and a unified diff of the small text files,
    `scrub`bed before it is cut."""
    log = RevisionLog(session)
    new = log.manifest(rev)
    against = max(0, rev - 1)
    old = log.manifest(against) if against != rev else new
    out = io.StringIO()
    print_diff(session, rev, against, out=out)
    text = scrub(out.getvalue())
    if len(text) > MAX_DIFF:
        text = text[:MAX_DIFF] + f"\n[cut for the page: {len(text)} characters in all; `quinebox world diff` has it whole]\n"
    listed = describe(old, changes(old, new))
    return {"rev": rev, "against": against, "changes": [{"code": code, "path": path} for code, path in listed], "diff": text}


def files(session: str, rev: int) -> dict[str, Any]:
    manifest = RevisionLog(session).manifest(rev)
    return {"rev": rev, "files": [{"path": path, "type": entry.get("type"), "size": entry.get("size", 0)} for path, entry in sorted(manifest.items())]}


def file(session: str, rev: int, path: str) -> dict[str, Any]:
    """One file's text at `rev`; binary, large or unkept files are named with their size, not sent."""
    entry = RevisionLog(session).manifest(rev).get(path)
    if entry is None:
        raise WorldError(f"revision {rev} of session {session} has no {path!r}")
    size = int(entry.get("size", 0))
    shown: dict[str, Any] = {"path": path, "size": size, "type": entry.get("type"), "text": None, "binary": False}
    if entry.get("type") == "l":
        shown["text"] = f"-> {entry.get('target', '')}"
    if entry.get("type") != "f" or not entry.get("sha") or size > MAX_FILE:
        return shown
    data = ObjectStore().path(entry["sha"]).read_bytes()
    if b"\0" in data:
        shown["binary"] = True
        return shown
    shown["text"] = data.decode(errors="replace")
    return shown

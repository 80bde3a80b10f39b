"""Reading worlds back: `quinebox world log`, `quinebox world diff` and `quinebox world export`."""

from __future__ import annotations

import difflib
import sys
from datetime import datetime

from quinebox.errors import ErrorKind
from quinebox.state import state_dir
from quinebox.worlds.materialize import exported
from quinebox.worlds.revisions import ObjectStore, RevisionLog, WorldError, changes, describe

#: Files larger than this are named in a diff, not shown line by line.
TEXT_DIFF_MAX = 256 << 10


def resolve(prefix: str) -> str:
    """A session id from a unique prefix, among sessions that have a world."""
    root = state_dir() / "sessions"
    found = sorted(p.name for p in root.glob(f"{prefix}*") if (p / "world" / "meta.json").exists()) if prefix and "/" not in prefix else []
    if len(found) != 1:
        raise WorldError(
            f"no world for session {prefix!r} (or more than one starts so): `quinebox ls` lists sessions",
            kind=ErrorKind.NOT_FOUND if not found else ErrorKind.BAD_INPUT, ref=prefix,
        )
    return found[0]


def print_log(session: str) -> None:
    records = RevisionLog(session).records()
    if not records:
        raise WorldError(f"session {session} has no world revisions", kind=ErrorKind.NOT_FOUND, session=session)
    print(f"{'REV':>4}  {'TIME':8}  {'TURN':>4}  {'PATHS':>5}  {'BYTES':>9}  WHAT")
    for r in records:
        when = datetime.fromtimestamp(r["t"]).strftime("%H:%M:%S")
        what = r.get("command") or r.get("what", "")
        if r["rev"] == 0 and r.get("base"):
            what = f"start: copy-on-write over {r['base']['session']} revision {r['base']['rev']}"
        turn = r.get("turn")
        print(f"{r['rev']:>4}  {when:8}  {turn if turn is not None else '-':>4}  {r.get('files', 0):>5}  {r.get('bytes', 0):>9}  {' '.join(str(what).split())[:100]}")


def print_diff(session: str, rev: int | None, against: int | None, *, out=None) -> None:
    """What `rev` (default: the newest) changed since `against` (default: the revision before it)."""
    log = RevisionLog(session)
    new = log.manifest(rev)
    rev = rev if rev is not None else log.records()[-1]["rev"]
    against = against if against is not None else max(0, rev - 1)
    old = log.manifest(against) if against != rev else new
    listed = describe(old, changes(old, new))
    store = ObjectStore()
    out = out or sys.stdout
    for code, path in listed:
        out.write(f"{code} {path}\n")
    for code, path in listed:
        a, b = _text(store, old.get(path)), _text(store, new.get(path))
        if a is None or b is None:
            continue
        out.writelines(difflib.unified_diff(a, b, f"a/{path}" if code != "A" else "/dev/null", f"b/{path}" if code != "D" else "/dev/null"))


def _text(store: ObjectStore, entry: dict | None) -> list[str] | None:
    """A file's lines for a diff ([] when absent); None for what is not small text."""
    if entry is None:
        return []
    if entry["type"] != "f" or not entry.get("sha") or entry["size"] > TEXT_DIFF_MAX:
        return None
    data = store.path(entry["sha"]).read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode().splitlines(keepends=True)
    except UnicodeDecodeError:
        return None


def export(session: str, rev: int | None, out) -> list[str]:
    """A revision of a world as a tar stream on `out`; the paths whose bytes were not kept."""
    manifest = RevisionLog(session).manifest(rev)
    return exported(manifest, ObjectStore(), out)

"""Map and batch runs as the view shows them: each run's record (tree/runs.py) joined with its DIR/results.jsonl.

Every file here may be mid-write by a live run, cut short by a kill, or edited by hand: a torn last line,
junk JSON or a field of the wrong type is skipped, never raised. Files are parsed again only when their
size, time or inode changed, so a page polling many finished runs costs a few stats.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from quinebox.processes import owner_alive
from quinebox.tree.fanout import RESULTS
from quinebox.tree.runs import ATTEMPTS, END, RUN, runs_dir

#: How much of each deliverable a run's page shows.
OUTPUT_HEAD = 4096
#: Read past the head, so that scrubbing sees whole any secret the cut would split.
SCRUB_MARGIN = 1024
#: What a run id (a directory name under runs/) may look like; anything else is no run.
RUN_ID = re.compile(r"[0-9A-Za-z][0-9A-Za-z._-]{0,127}")

T = TypeVar("T")
_Key = tuple[int, int, int]
_cache: dict[tuple[str, str], tuple[_Key, Any]] = {}
#: Owners seen dead stay dead (a pid with the same start time never comes back): not checked again.
_dead: set[str] = set()


@dataclass(frozen=True)
class _Header:
    """run.json, checked."""

    id: str
    kind: str | None
    mission: str | None
    out: Path | None
    started: float | None
    owner: str | None
    inputs: tuple[tuple[str, str], ...]  # (name, source), each name once
    resumed: frozenset[str]


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _key(info: os.stat_result) -> _Key:
    return (info.st_mtime_ns, info.st_size, info.st_ino)


def _stat_key(path: Path) -> _Key | None:
    try:
        return _key(os.stat(path))
    except OSError:
        return None


def _parsed(kind: str, path: Path, parse: Callable[[bytes], T]) -> T | None:
    """`parse` of the regular file at `path` (None if there is none), from the cache while the file is unchanged."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        cached = _cache.get((kind, str(path)))
        if cached is not None and cached[0] == _key(info):
            return cached[1]
        with os.fdopen(os.dup(fd), "rb") as file:
            value = parse(file.read())
    except OSError:
        return None
    finally:
        os.close(fd)
    _cache[(kind, str(path))] = (_key(info), value)
    return value


def _json(data: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _lines(data: bytes) -> list[dict[str, Any]]:
    """The whole lines that are JSON objects: the last piece, without its newline, may still be being written."""
    found = []
    for line in data.split(b"\n")[:-1]:
        value = _json(line)
        if value is not None:
            found.append(value)
    return found


def _header(run_id: str) -> _Header | None:
    def parse(data: bytes) -> _Header | None:
        doc = _json(data)
        if doc is None:
            return None
        out = _text(doc.get("out"))
        inputs: dict[str, str] = {}
        listed, resumed = doc.get("inputs"), doc.get("resumed")
        for entry in listed if isinstance(listed, list) else []:
            if isinstance(entry, dict) and isinstance(entry.get("name"), str) and isinstance(entry.get("source"), str):
                inputs.setdefault(entry["name"], entry["source"])
        return _Header(
            id=run_id, kind=_text(doc.get("kind")), mission=_text(doc.get("mission")),
            out=Path(out) if out and os.path.isabs(out) else None, started=_number(doc.get("started")), owner=_text(doc.get("owner")),
            inputs=tuple(inputs.items()), resumed=frozenset(s for s in resumed if isinstance(s, str)) if isinstance(resumed, list) else frozenset(),
        )

    return _parsed("run", runs_dir() / run_id / RUN, parse)


def _attempts(run_id: str) -> dict[str, list[dict[str, Any]]]:
    """Per input name, its attempts' starts in order: {"t", "session"}."""

    def parse(data: bytes) -> dict[str, list[dict[str, Any]]]:
        by_name: dict[str, list[dict[str, Any]]] = {}
        for line in _lines(data):
            if isinstance(line.get("name"), str):
                by_name.setdefault(line["name"], []).append({"t": _number(line.get("t")), "session": _text(line.get("session"))})
        return by_name

    return _parsed("attempts", runs_dir() / run_id / ATTEMPTS, parse) or {}


def _results(header: _Header) -> dict[str, dict[str, Any]]:
    """Per source, how it finished: this run's own lines, and those of earlier runs that `--resume` kept for it."""
    if header.out is None:
        return {}

    def parse(data: bytes) -> list[dict[str, Any]]:
        checked = []
        for line in _lines(data):
            source, code = _text(line.get("input")), _integer(line.get("exit_code"))
            if source is None or code is None:
                continue
            checked.append({
                "source": source, "run": _text(line.get("run")), "exit_code": code, "attempts": _integer(line.get("attempts")),
                "session": _text(line.get("session")), "duration_s": _number(line.get("duration_s")),
                "tokens": _integer(line.get("tokens")), "termination": _text(line.get("termination")),
            })
        return checked

    found: dict[str, dict[str, Any]] = {}
    for line in _parsed("results", header.out / RESULTS, parse) or []:
        if line["run"] == header.id:
            found[line["source"]] = line
        elif line["source"] in header.resumed and line["exit_code"] == 0:
            found.setdefault(line["source"], line)
    return found


def _end(run_id: str) -> dict[str, Any] | None:
    def parse(data: bytes) -> dict[str, Any] | None:
        doc = _json(data)
        code = _integer(doc.get("exit_code")) if doc else None
        return None if doc is None or code is None else {"ended": _number(doc.get("ended")), "exit_code": code}

    return _parsed("end", runs_dir() / run_id / END, parse)


def _alive(owner: str | None) -> bool:
    if owner is None or owner in _dead:
        return False
    if owner_alive(owner):
        return True
    _dead.add(owner)
    return False


def _state(header: _Header, end: dict[str, Any] | None) -> str:
    if end is not None:
        return "done" if end["exit_code"] == 0 else "failed"
    return "running" if _alive(header.owner) else "killed"


def _inputs(header: _Header, state: str) -> list[dict[str, Any]]:
    """Each input's state: done or failed by its result; started and not finished is running while the run is, and
    failed (termination "killed" or "stopped") once it is not; queued otherwise."""
    attempts, results = _attempts(header.id), _results(header)
    now = time.time()
    rows = []
    for name, source in header.inputs:
        tried, result = attempts.get(name, []), results.get(source)
        row: dict[str, Any] = {"name": name, "source": source, "state": "queued", "exit_code": None, "attempts": len(tried),
                               "session": tried[-1]["session"] if tried else None, "duration_s": None, "tokens": None, "termination": None}
        if result is not None:
            row.update({key: result[key] for key in ("exit_code", "duration_s", "tokens", "termination")})
            row.update(state="done" if result["exit_code"] == 0 else "failed", session=result["session"] or row["session"])
            row["attempts"] = result["attempts"] if result["attempts"] is not None else len(tried)
        elif tried and state == "running":
            first = tried[0]["t"]
            row.update(state="running", duration_s=None if first is None else round(max(0.0, now - first), 3))
        elif tried:
            row.update(state="failed", termination="killed" if state == "killed" else "stopped")
        rows.append(row)
    return rows


def _summary(header: _Header) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    end = _end(header.id)
    state = _state(header, end)
    inputs = _inputs(header, state)
    counts = {key: sum(1 for row in inputs if row["state"] == key) for key in ("done", "failed", "running")}
    summary = {
        "id": header.id, "kind": header.kind, "mission": header.mission, "out": None if header.out is None else str(header.out),
        "started": header.started, "ended": end["ended"] if end else None, "exit_code": end["exit_code"] if end else None,
        "state": state, "total": len(inputs), **counts,
    }
    return summary, inputs


def _ids() -> list[str]:
    try:
        return [name for name in os.listdir(runs_dir()) if RUN_ID.fullmatch(name)]
    except OSError:
        return []


def runs() -> list[dict[str, Any]]:
    """Every recorded run, newest first. `done` counts the inputs that succeeded, `failed` those that did not:
    with `running`, and the queued rest, they add up to `total`."""
    found = []
    for run_id in _ids():
        header = _header(run_id)
        if header is not None:
            found.append(_summary(header)[0])
    found.sort(key=lambda row: (row["started"] or 0.0, row["id"]), reverse=True)
    return found


def run(run_id: str, scrub: Callable[[str], str] = str) -> dict[str, Any]:
    """One run and each of its inputs, with the head of its deliverable, `scrub`bed before it is cut. KeyError: no such run."""
    header = _header(run_id) if isinstance(run_id, str) and RUN_ID.fullmatch(run_id) else None
    if header is None:
        raise KeyError(run_id)
    summary, inputs = _summary(header)
    for row in inputs:
        row["output"], row["output_bytes"] = _output(header.out, row["name"], scrub)
    return {**summary, "inputs": inputs}


def _output(out: Path | None, name: str, scrub: Callable[[str], str]) -> tuple[str | None, int | None]:
    """The first OUTPUT_HEAD characters of DIR/<name>.out, and its size; a name that could leave DIR has none.
    A little more is read and scrubbed before the cut, so that a secret across it is not left half shown."""
    if out is None or not name or name.startswith(".") or "/" in name or "\0" in name:
        return None, None
    try:
        fd = os.open(out / f"{name}.out", os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None, None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None, None
        return scrub(os.pread(fd, OUTPUT_HEAD + SCRUB_MARGIN, 0).decode(errors="replace"))[:OUTPUT_HEAD], info.st_size
    except OSError:
        return None, None
    finally:
        os.close(fd)


def run_stamp() -> str:
    """Changes whenever a run's record or results change, or a run's owner dies: a few stats per run, no parsing
    (a run.json is parsed once). A deliverable growing while its input runs does not count until its result lands."""
    seen: list[tuple[str, Any]] = []
    for run_id in sorted(_ids()):
        here = runs_dir() / run_id
        header = _header(run_id)
        files = [here / RUN, here / ATTEMPTS, here / END, *([header.out / RESULTS] if header and header.out else [])]
        stamps = {path.name: _stat_key(path) for path in files}
        seen.append((run_id, sorted(stamps.items())))
        if header is not None and stamps[END] is None:
            seen.append((run_id, _alive(header.owner)))
    return hashlib.blake2b(repr(seen).encode(), digest_size=12).hexdigest()

"""`quinebox prune`: finished sessions leave the state dir, with their tapes, worlds and revisions, the world
objects only they named, and the run records of theirs that ended.

Which go is a pure function (`choose`) of the index's rows, the rules given, and what is held: a session not
ended (running, waiting, or one whose owner died before it could end it), one a live box or lasting box
still has (run/), one a pending approval waits in, one an unfinished `map`/`batch` run (a `--resume` to
come) started. What stays keeps what it needs: its parent, and whichever sessions its world was forked or
inherited from (a child's overlay reads their layers). Each pruned session leaves a tombstone in the index,
so `show`, `logs`, `tree`, `replay` and `fork` say it was pruned and when. The audit log is never edited: a
record says what was pruned, how much, and by whom, before anything goes.

A session dir that cannot be removed whole (a read-only mount inside it, files the user may not remove) is
tombstoned all the same, and said (`Stayed`): what is left counts as nothing freed, and each later prune
tries it again.

Unpacked images leave the cache as under `gc`, by its own step (box/owners/gc.py: never one a box uses; those
whose image went, those no box used for `retention: {images:}`, those changed), first: a bad `retention:` or
boxes that cannot be listed stop the prune before anything has gone.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from quinebox.agent.store import Index, SessionRow
from quinebox.audit.approvals import pending
from quinebox.audit.log import record
from quinebox.box.owners.gc import prune_images
from quinebox.box.owners.listing import every_box, reachable_engine
from quinebox.errors import ErrorKind, QuineboxError
from quinebox.processes import user_name
from quinebox.state import private_dir, private_file, run_dir, session_dir, state_dir, tree_bytes
from quinebox.tree.runs import END, attempted, runs_dir
from quinebox.worlds.revisions import ObjectStore
from quinebox.worlds.sweep import Swept, sweep

if TYPE_CHECKING:
    from quinebox.box.images.eviction import Evicted

OUTCOMES = ("failed", "succeeded")


class RulesError(QuineboxError):
    """Prune rules that name nothing, or name it wrongly: usage (exit 2), and nothing is pruned."""

    exit_code = 2
    default_kind = ErrorKind.BAD_INPUT


@dataclass(frozen=True)
class Rules:
    """Which finished sessions may go: older than `older_than` seconds (since they ended), all but the newest
    `keep`, only those that `failed` (exit status not 0) or `succeeded`. Each given rule must hold."""

    older_than: float | None = None
    keep: int | None = None
    outcome: str | None = None

    def __post_init__(self) -> None:
        if self.older_than is None and self.keep is None and self.outcome is None:
            raise RulesError("say which sessions to prune: --older-than DURATION, --keep N, --failed or --succeeded (--dry-run lists them first)")
        if self.keep is not None and self.keep < 0:
            raise RulesError(f"--keep {self.keep}: give how many of the newest sessions to keep, 0 or more")
        if self.outcome not in (None, *OUTCOMES):
            raise RulesError(f"bad outcome {self.outcome!r}: failed or succeeded")

    def matches(self, row: SessionRow, now: float) -> bool:
        if row.ended is None:
            return False
        if self.older_than is not None and now - row.ended < self.older_than:
            return False
        failed = row.exit_code != 0
        return self.outcome is None or failed == (self.outcome == "failed")

    def candidates(self, rows: list[SessionRow], now: float, sessions: Path | None = None) -> set[str]:
        """The finished sessions these rules name, before what is held or needed is kept back."""
        finished = sorted((r for r in rows if r.ended is not None), key=lambda r: r.started, reverse=True)
        newest = {r.id for r in finished[: self.keep]} if self.keep is not None else set()
        return {r.id for r in finished if r.id not in newest and self.matches(r, now)}

    def said(self) -> dict[str, object]:
        return {k: v for k, v in (("older_than", self.older_than), ("keep", self.keep), ("outcome", self.outcome)) if v is not None}


class Selection(Protocol):
    """What picks the sessions to prune: the command line's `Rules`, or config.yaml's `retention:` (tree/retention.py)."""

    def candidates(self, rows: list[SessionRow], now: float, sessions: Path | None = None) -> set[str]: ...

    def said(self) -> dict[str, object]: ...


def choose(
    rows: list[SessionRow], rules: Selection, *, now: float, held: Iterable[str] = (), needs: dict[str, set[str]] | None = None, sessions: Path | None = None,
) -> list[SessionRow]:
    """The rows that go, oldest first: those `rules` names, less those `held` (sessions that stay whatever is said)
    and whatever a staying session needs. `needs`: for any session, indexed or not (an exec's world), the sessions
    its world reads (its base, its overlay's lowers)."""
    needs = needs or {}
    finished = {r.id for r in rows if r.ended is not None}
    going = (rules.candidates(rows, now, sessions) & finished) - set(held)
    parents = {r.id: r.parent for r in rows}
    staying = [s for s in {*parents, *needs} if s not in going]
    while staying:  # what stays keeps its parent and the worlds it reads, and so on up
        session = staying.pop()
        wanted = set(needs.get(session, ()))
        parent = parents.get(session)
        if parent:
            wanted.add(parent)
        for other in wanted & going:
            going.discard(other)
            staying.append(other)
    return sorted((r for r in rows if r.id in going), key=lambda r: r.started)


@dataclass(frozen=True)
class Stayed:
    """A pruned session's dir that could not be removed whole: the first removal that failed and why, and the
    bytes still there."""

    session: str
    path: str
    why: str
    bytes: int


@dataclass
class Pruned:
    """What a prune took, or (dry) would take. A session's bytes are those its removal freed (`stayed` has the
    rest), or with `dry` those it holds."""

    sessions: list[tuple[SessionRow, int]] = field(default_factory=list)
    objects: Swept = field(default_factory=Swept)
    runs: int = 0
    images: list[Evicted] = field(default_factory=list)
    stayed: list[Stayed] = field(default_factory=list)

    @property
    def session_bytes(self) -> int:
        return sum(size for _, size in self.sessions)

    @property
    def image_bytes(self) -> int:
        return sum(image.size for image in self.images)


def prune(rules: Selection, *, dry: bool = False, now: float | None = None) -> Pruned:
    """Prune this state dir by `rules` (see the module's docstring); with `dry`, only say what would go."""
    now = time.time() if now is None else now
    lock = _exclusive()
    index = Index()
    try:
        rows = index.every()
        sessions = state_dir() / "sessions"
        chosen = choose(rows, rules, now=now, held=held(), needs=world_needs(sessions), sessions=sessions)
        done = Pruned(sessions=[(row, tree_bytes(session_dir(row.id))) for row in chosen])
        ids = [row.id for row in chosen]
        engine = reachable_engine(None)
        done.images = prune_images(every_box(engine, connect=False), engine, dry=dry)
        if dry:
            done.objects = sweep(ObjectStore(), sessions, without=frozenset(ids), dry=True)
            done.runs = len(ended_runs(set(ids), {r.id for r in rows}))
            return done
        if ids:
            record("prune", None, sessions=len(ids), bytes=done.session_bytes, ids=ids[:1000], rules=rules.said(), by=_whom())
            index.forget(ids, now)
        for position, (row, size) in enumerate(done.sessions):
            stayed = remove_session(row.id)
            if stayed is not None:
                done.sessions[position] = (row, max(size - stayed.bytes, 0))
                done.stayed.append(stayed)
        try:  # sessions pruned before whose dirs stayed then: tried again
            earlier = sorted((set(os.listdir(sessions)) - set(ids)) & index.every_pruned().keys())
        except FileNotFoundError:
            earlier = []
        done.stayed += [stayed for stayed in map(remove_session, earlier) if stayed is not None]
        done.objects = sweep(ObjectStore(), sessions)
        for run in ended_runs(set(ids), {r.id for r in rows}):
            shutil.rmtree(run, ignore_errors=True)
            done.runs += 1
        if done.objects.objects or done.runs or done.images or done.stayed:
            images = {"images": len(done.images), "image_bytes": done.image_bytes, "image_ids": [f"sha256:{image.name}" for image in done.images]}
            left = [asdict(stayed) for stayed in done.stayed[:1000]]
            record("pruned", None, objects=done.objects.objects, object_bytes=done.objects.bytes, runs=done.runs, **images, stayed=left, by=_whom())
        return done
    finally:
        index.close()
        os.close(lock)


def remove_session(session: str) -> Stayed | None:
    """Remove a pruned session's dir as far as it goes (all of it that can be, past what cannot); None when it is
    gone, else what stays and the first removal that failed."""
    path = session_dir(session)
    failed: list[str] = []

    def said(_: Any, name: str, exc: Any) -> None:
        error = exc if isinstance(exc, BaseException) else exc[1]  # onexc's exception, or onerror's exc_info
        if not failed and not isinstance(error, FileNotFoundError):  # one gone meanwhile is as good as removed
            failed.append(f"cannot remove {name}: {getattr(error, 'strerror', None) or error}")

    handler: dict[str, Any] = {"onexc" if sys.version_info >= (3, 12) else "onerror": said}
    shutil.rmtree(path, **handler)
    if not os.path.lexists(path):
        return None
    return Stayed(session, str(path), failed[0] if failed else "it is still there", tree_bytes(path))


def held() -> set[str]:
    """Sessions that something live still has: a box's socket or bundle, a lasting box's record (run/), a pending
    approval, an unfinished run's attempts."""
    found: set[str] = set()
    run = run_dir()
    for where in (run, run / "sandboxes"):
        try:
            found.update(name.split(".", 1)[0] for name in os.listdir(where))
        except FileNotFoundError:
            pass
    found.update(str(entry["session"]) for entry in pending() if entry.get("session"))
    try:
        runs = list(os.scandir(runs_dir()))
    except FileNotFoundError:
        runs = []
    for run_record in runs:
        if not os.path.exists(os.path.join(run_record.path, END)):
            found.update(attempted(Path(run_record.path)))
    return found


def world_needs(sessions: Path) -> dict[str, set[str]]:
    """For each session dir with a world: the sessions that world reads (meta.json's base, and overlay lowers that
    are another session's layers)."""
    needs: dict[str, set[str]] = {}
    try:
        entries = list(os.scandir(sessions))
    except FileNotFoundError:
        return needs
    prefix = str(sessions) + os.sep
    for entry in entries:
        try:
            meta = json.loads((Path(entry.path) / "world" / "meta.json").read_bytes())
        except (FileNotFoundError, NotADirectoryError, ValueError):
            continue
        wanted = {str(meta["base"][0])} if meta.get("base") else set()
        wanted.update(lower[len(prefix) :].split(os.sep, 1)[0] for lower in meta.get("lowers") or () if str(lower).startswith(prefix))
        wanted.discard(entry.name)
        if wanted:
            needs[entry.name] = wanted
    return needs


def ended_runs(pruned: set[str], indexed: set[str]) -> list[Path]:
    """Run records that ended and whose every session is gone (pruned now, or no longer indexed)."""
    gone: list[Path] = []
    try:
        runs = list(os.scandir(runs_dir()))
    except FileNotFoundError:
        return gone
    for run in runs:
        path = Path(run.path)
        if not (path / END).exists():
            continue
        started = attempted(path)
        if all(s in pruned or s not in indexed for s in started):
            gone.append(path)
    return gone


def _exclusive() -> int:
    """One prune at a time per state dir; a second is refused at once rather than waiting behind the first."""
    path = state_dir() / "prune.lock"
    private_dir(path.parent)
    fd = private_file(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise QuineboxError(f"another `quinebox prune` is pruning {state_dir()}: wait for it to end", kind=ErrorKind.CONFLICT, state_dir=str(state_dir())) from None
    return fd


def _whom() -> dict[str, object]:
    uid = os.getuid()
    return {"user": user_name(uid), "uid": uid, "pid": os.getpid()}

"""A world in use: its host side while its box runs, kept current from the tracker, revised on request.

Everything here that reads or writes a world walks beneath its root (see
beneath.py): a box may have planted symlinks anywhere in it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

from quinebox.worlds import beneath
from quinebox.worlds.build import create, discard, hand_over, load_spec
from quinebox.worlds.revisions import (
    CHUNK,
    NODES,
    Changes,
    ConflictError,
    Manifest,
    ObjectStore,
    RevisionLog,
    Scanner,
    WorldError,
    apply,
    below,
    changes,
    describe,
    merge,
    new_bytes,
    unkept,
)
from quinebox.worlds.spec import WorldSpec, world_dir


class World:
    """A world's host side while its box runs (or, offline, for a command after it ended).

    It keeps the world's manifest current from the tracker's changed paths and
    appends a revision whenever asked and something changed.
    """

    def __init__(self, session: str, spec: WorldSpec, *, track: bool = True, limit: int | None = None, on_full: Callable[[str], None] | None = None):
        self.session = session
        self.spec = spec
        self.log = RevisionLog(session)
        self.store = ObjectStore()
        self._lock = threading.Lock()
        self._root_fd = os.open(spec.layer, beneath.DIR_FLAGS)
        self.tracker = None
        self._lease = -1
        #: Made for this box, so a box that never started takes it with it (open_world); else it was there already.
        self.made = False
        try:
            self._lease = self.store.lease()  # before its first put: what it puts is spared by a sweep (revisions.py)
            self.base: Manifest = RevisionLog(spec.base[0]).manifest(spec.base[1]) if spec.kind == "overlay" and spec.base else {}
            if track:
                from quinebox.worlds.tracker import Tracker

                self.tracker = Tracker(spec.layer, limit=limit, on_full=on_full)
            records = self.log.records()
            if records:  # offline: start from what was recorded; the first revise rereads the layer (no tracker)
                self.rev = records[-1]["rev"]
                self.manifest = self.log.manifest()
                #: Until then a stand-in, only so that unchanged files are not rehashed: same paths, sizes and mtimes.
                self.layer = dict(self.manifest)
            else:
                self.rev = -1
                self.layer = self._scan(previous={})
                self.manifest = self._merged()
                first: dict[str, Any] = {"rev": 0, "what": "start", "changes": {} if self.spec.kind == "overlay" else self.manifest}
                if spec.kind == "overlay" and spec.base:
                    first["base"] = {"session": spec.base[0], "rev": spec.base[1]}
                # Rev 0 of a world that starts empty is not fsynced: it says only that the world was made empty, as
                # its meta.json (written unsynced a moment before) does. The next revision's fsync makes both durable
                # with it, and a world that stays empty is removed at its box's end; on this machine the fsync of a
                # new file in new directories (a journal commit) was 1-4 ms of every box's start.
                self._append(first, self.manifest, sync=bool(self.manifest) or "base" in first)
        except BaseException:
            self.close()
            raise

    @classmethod
    def offline(cls, session: str) -> World:
        spec, _ = load_spec(session)
        return cls(session, spec, track=False)

    def _scan(self, previous: Manifest) -> Manifest:
        return dict(Scanner(self.store, previous, layer=self.spec.kind == "overlay").walk(self._root_fd))

    def _merged(self) -> Manifest:
        """The world as the box sees it, as a manifest of its own (the layer goes on changing)."""
        return merge(self.base, self.layer) if self.spec.kind == "overlay" else dict(self.layer)

    def _append(self, record: dict[str, Any], manifest: Manifest, *, sync: bool = True) -> dict[str, Any]:
        self.rev = record["rev"]
        self.manifest = manifest
        delta = record["changes"]
        return self.log.append({**record, "files": sum(1 for e in delta.values() if not e or e["type"] != "d"), "bytes": new_bytes(delta)}, sync=sync)

    def revise(self, what: str, *, turn: int | None = None, command: str | None = None) -> dict[str, Any] | None:
        """A new revision if the world changed since the newest (its record), else None; `rev` is the newest either way."""
        try:
            return self._revise(what, turn, command)
        except OSError as exc:  # the box may have made its world odd in ways we cannot read
            raise WorldError(f"cannot read the world of {self.session}: {exc}") from None

    def _revise(self, what: str, turn: int | None, command: str | None) -> dict[str, Any] | None:
        with self._lock:
            old = self.manifest
            dirty, lost = self.tracker.take() if self.tracker else (set(), True)
            if lost:
                self.layer = self._scan(previous=self.layer)
                touched = None
            else:
                touched = self._update(dirty)
            new = self._merged()
            if touched is None or self.spec.kind == "overlay":
                delta = changes(old, new)
            else:
                delta = {p: new.get(p) for p in touched if old.get(p) != new.get(p)}
            if not delta:
                return None
            record = {"rev": self.rev + 1, "what": what, "changes": delta}
            if turn is not None:
                record["turn"] = turn
            if command is not None:
                record["command"] = command[:4096]
            return self._append(record, new)

    def _update(self, dirty: set[str]) -> set[str]:
        """Reread just the changed paths (and whatever is below a directory that appeared); the paths touched."""
        touched: set[str] = set()
        scanner = Scanner(self.store, self.layer, layer=self.spec.kind == "overlay")
        for path in sorted(dirty, key=lambda p: p.count("/")):
            old = self.layer.get(path)
            entry = self._reread(scanner, path)
            if entry is None or (old and old["type"] == "d" and (entry["type"] != "d" or entry.get("opaque") != old.get("opaque"))):
                for sub in below(self.layer, path) if old and old["type"] == "d" else []:
                    touched.add(sub)
                    del self.layer[sub]
            touched.add(path)
            if entry is None:
                self.layer.pop(path, None)
                continue
            self.layer[path] = entry
            if entry["type"] == "d" and (old is None or old["type"] != "d"):
                for sub, sub_entry in scanner.walk(self._root_fd, path, fresh=True):
                    self.layer[sub] = sub_entry
                    touched.add(sub)
        return touched

    def _reread(self, scanner: Scanner, path: str) -> dict[str, Any] | None:
        """`path`'s entry now; None when it is gone (or was swapped for something we do not follow)."""
        try:
            parent, name = beneath.open_parent(self._root_fd, path)
        except (OSError, beneath.Escape):
            return None
        try:
            return scanner.entry(parent, name, path, os.stat(name, dir_fd=parent, follow_symlinks=False), fresh=True)
        except (FileNotFoundError, beneath.Escape):
            return None
        finally:
            os.close(parent)

    def restore_plan(self, rev: int) -> tuple[dict[str, Any], Iterator[bytes]]:
        """What makes the world as it was at `rev`: the plan for the guest to carry out, and the files' bytes in order."""
        target = self.log.manifest(rev)
        self.revise("before restore")
        plan, data = self.plan(target)
        undone = []
        for path in sorted(set(self.manifest) | set(target)):
            now, then = self.manifest.get(path), target.get(path)
            if not _differs(now, then) or (then is not None and unkept(then)):
                continue  # the plan's `lost` names what cannot be brought back
            undone.append(f"removed {path} (made after revision {rev})" if then is None else f"brought back {path}" if now is None else f"restored {path}")
        return {**plan, "revision": rev, "before": self.rev, "undone": undone}, data

    def adopt_plan(self, child: str, *, force: bool = False) -> tuple[dict[str, Any], Iterator[bytes]]:
        """What carries a finished child's changes into this (running) world, for the guest to carry out."""
        delta, base = child_changes(child, inherited(child, self.session))
        self.revise("before adopt")
        refuse_conflicts(child, delta, changes(base, self.manifest), force)
        plan, data = self.plan(apply(self.manifest, delta))
        return {**plan, "adopted": [f"{code} {path}" for code, path in describe(base, delta)]}, data

    def plan(self, target: Manifest) -> tuple[dict[str, Any], Iterator[bytes]]:
        """The steps from this world's newest revision to `target`; the guest takes them inside the box,
        where the kernel (and overlay) see every write. What cannot be made again (`unkept`) is left as
        it is and named in the plan's `lost`, for the guest to report with whatever else it could not do."""
        current = self.manifest
        remove = [p for p, e in current.items() if p not in target or target[p]["type"] != e["type"] or (e["type"] not in ("f", "d") and target[p] != e)]
        remove = [p for p in sorted(remove) if not any(p.startswith(r + "/") for r in remove if r != p)]
        wanted = {p: e for p, e in sorted(target.items()) if _differs(current.get(p), e) or (e["type"] == "d" and current.get(p) != e)}
        lost = {p: why for p, e in wanted.items() if (why := unkept(e))}
        files = [(p, e) for p, e in wanted.items() if e["type"] == "f" and p not in lost]
        plan = {
            "kind": "world_plan",
            "remove": remove,
            "dirs": [[p, e["mode"]] for p, e in wanted.items() if e["type"] == "d"],
            "links": [[p, e["target"]] for p, e in wanted.items() if e["type"] == "l"],
            "nodes": [[p, e["type"], e["mode"]] for p, e in wanted.items() if e["type"] in NODES],
            "files": [[p, e["mode"], e["size"], e.get("mtime", 0)] for p, e in files],
            "lost": [f"{p}: {why}" for p, why in lost.items()],
        }

        def data() -> Iterator[bytes]:
            for _, entry in files:
                with self.store.open(entry["sha"]) as f:
                    while chunk := f.read(CHUNK):
                        yield chunk

        return plan, data()

    def close(self) -> None:
        if self.tracker is not None:
            self.tracker.close()
            self.tracker = None
        if self._root_fd >= 0:
            os.close(self._root_fd)
            self._root_fd = -1
        if self._lease >= 0:
            os.close(self._lease)  # the sweep finds it unlocked, and removes it
            self._lease = -1


def _same_file(current: dict[str, Any] | None, target: dict[str, Any]) -> bool:
    if not current:
        return False
    return current["type"] == "f" and current.get("sha") == target["sha"] and current["mode"] == target["mode"]


def _differs(now: dict[str, Any] | None, then: dict[str, Any] | None) -> bool:
    """Whether restoring would change this path (a directory's mode or a file's mtime alone do not count)."""
    if now is None or then is None:
        return now is not then
    if now["type"] != then["type"]:
        return True
    return (then["type"] == "f" and not _same_file(now, then)) or (then["type"] not in ("f", "d") and now != then)


def open_world(session: str, spec: WorldSpec, *, uid: int, gid: int, limit: int, on_full: Callable[[str], None]) -> World:
    """Make a box's world (owned by `uid`:`gid`) and start tracking it, before its container exists; one already
    there (a resumed session's) is tracked as it is.

    `on_full` is called once the box has added more than `limit` bytes to it.
    """
    made = not world_dir(session).joinpath("meta.json").exists()  # else a resumed session's, which goes on as it is
    if made:
        create(session, spec, uid, gid)
    else:
        hand_over(session, spec, uid, gid)  # its new box's user may be another host uid than its last one's
    try:
        world = World(session, spec, limit=limit, on_full=on_full)
    except BaseException:
        if made:
            discard(session)
        raise
    world.made = made
    return world


def end_world(world: World, *, keep_unused: bool) -> None:
    """Take the last revision; unless `keep_unused`, remove a world that never changed and holds nothing."""
    try:
        world.revise("end")
    except WorldError:
        pass  # the revisions taken so far stand
    finally:
        world.close()
    if not keep_unused and world.rev == 0 and world.spec.kind != "bind" and not world.layer:
        discard(world.session)


# -- what a child changed ------------------------------------------------------------------


def inherited(child: str, parent: str | None = None) -> WorldSpec:
    """`child`'s world spec, if it inherited (from `parent`, when given): only then is there anything to adopt."""
    spec, _ = load_spec(child)
    if spec.kind != "overlay" or not spec.base or (parent is not None and spec.base[0] != parent):
        raise WorldError(f"session {child} did not inherit {'this' if parent else 'its'} world, so there is nothing to adopt from it")
    return spec


def child_changes(child: str, spec: WorldSpec) -> tuple[Changes, Manifest]:
    """(what `child` changed in its inherited world, the parent's revision it started from)."""
    assert spec.base is not None
    base = RevisionLog(spec.base[0]).manifest(spec.base[1])
    return changes(base, RevisionLog(child).manifest()), base


def refuse_conflicts(child: str, delta: Changes, ours: Changes, force: bool) -> None:
    conflicts = sorted(p for p in delta if p in ours and ours[p] != delta[p])
    if conflicts and not force:
        shown = ", ".join(conflicts[:10]) + (f" and {len(conflicts) - 10} more" if len(conflicts) > 10 else "")
        raise ConflictError(f"refused to adopt {child}: its parent changed {shown} too since the fork; --force takes the child's")

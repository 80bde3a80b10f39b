"""Worlds: each box's /world, built for its task by whoever started it, and kept with its revisions.

    sessions/<id>/world/
      meta.json          the world's WorldSpec and owner, for commands that come later
      tree/              a dir world's files
      upper/, work/      an overlay world's own layer, and overlay's scratch directory
      revisions.jsonl    its revisions (revisions.py)

A box at the host gets an empty world, the caller's directory (`--world DIR`),
copies of host paths, or an archive's contents. A child's world is built from
its parent's: `inherit` is an overlay whose lower layers are the parent's, so
the child's writes stay in its own layer until the parent adopts them; `empty`;
or only the listed paths, copied from the parent's newest revision.

Everything here that reads or writes a world walks beneath its root (see
beneath.py): a box may have planted symlinks anywhere in it.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import threading
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from quinebox import beneath
from quinebox.errors import GrantError
from quinebox.grants import Mount, check_mount
from quinebox.revisions import (
    CHUNK,
    Changes,
    ConflictError,
    Manifest,
    ObjectStore,
    RevisionLog,
    Scanner,
    WorldError,
    apply,
    below,
    carry_out,
    changes,
    describe,
    merge,
    new_bytes,
)
from quinebox.spec import BoxSpec, WorldSpec
from quinebox.store import session_dir

#: An archive may hold at most this many members and bytes (before anything is written).
MAX_ARCHIVE_MEMBERS = 200_000
MAX_ARCHIVE_BYTES = int(os.environ.get("QUINEBOX_WORLD_MAX_ARCHIVE", str(8 << 30)))
#: Characters overlay's mount options cannot carry in a path.
_OVERLAY_UNSAFE = set(",:\\\n")


def world_dir(session: str) -> Path:
    return session_dir(session) / "world"


# -- choosing a world ------------------------------------------------------------------


def root_world(
    session: str,
    *,
    world: str | None,
    world_from: str | Sequence[str] | None,
    world_tar: str | None,
    cwd: str,
    protected: Iterable[str],
    world_at: tuple[str, int] | None = None,
) -> WorldSpec:
    """The world of a box started at the host, from the caller's options; checked, nothing made yet.

    `world_at` (session, revision): a copy of a recorded world, for `quinebox fork`.
    """
    protected = list(protected)
    chosen = [name for name, value in (("--world", world), ("--world-from", world_from), ("--world-tar", world_tar), ("--at", world_at)) if value]
    if len(chosen) > 1:
        raise GrantError(f"give one of --world, --world-from and --world-tar, not {' and '.join(chosen)}")
    tree = str(world_dir(session) / "tree")
    if world_at:
        return WorldSpec(kind="dir", layer=tree, base=world_at)
    if world:
        return WorldSpec(kind="bind", layer=_host_path(world, cwd, protected, "--world", directory=True))
    if world_tar:
        path = os.path.join(cwd, os.path.expanduser(world_tar))
        if not os.path.isfile(path):
            raise GrantError(f"bad --world-tar {world_tar!r}: no such archive file")
        return WorldSpec(kind="dir", layer=tree, archive=os.path.realpath(path))
    choice = [world_from] if isinstance(world_from, str) else list(world_from or [])
    if not choice or choice == ["empty"]:
        return WorldSpec(kind="dir", layer=tree)
    if choice == ["inherit"]:
        raise GrantError("--world-from inherit: a box started here has no parent world; use --world DIR to work on a directory, or --world-from PATH... to copy paths in")
    sources = tuple(_host_path(p, cwd, protected, "--world-from") for p in choice)
    names = [os.path.basename(s) for s in sources]
    if len(set(names)) != len(names):
        raise GrantError(f"--world-from {' '.join(choice)}: two paths would land on the same name in the world")
    return WorldSpec(kind="dir", layer=tree, sources=sources)


def _host_path(path: str, cwd: str, protected: list[str], option: str, *, directory: bool = False) -> str:
    full = os.path.normpath(os.path.join(cwd, os.path.expanduser(path)))
    if not os.path.lexists(full):
        raise GrantError(f"bad {option} {path!r}: {full} does not exist")
    if directory and not os.path.isdir(full):
        raise GrantError(f"bad {option} {path!r}: {full} is not a directory")
    return check_mount(Mount(source=full, dest="/world", writable=True), protected=protected).source


def child_world(parent: "World | None", session: str, choice: Any) -> WorldSpec:
    """A child's world from its request's `world`: "inherit" (the default), "empty", or a list of paths in the parent's."""
    choice = "inherit" if choice is None else choice
    if parent is None and choice != "empty":
        raise GrantError("this box has no world to pass on: ask for world \"empty\"")
    here = world_dir(session)
    if choice == "empty":
        return WorldSpec(kind="dir", layer=str(here / "tree"))
    if choice == "inherit":
        assert parent is not None
        parent.revise("fork")
        spec = parent.spec
        lowers = (spec.layer, *spec.lowers) if spec.kind == "overlay" else (spec.layer,)
        for path in (*lowers, str(here)):
            if _OVERLAY_UNSAFE & set(path):
                raise WorldError(f"cannot build a copy-on-write world on {path}: overlay cannot mount paths with , : or \\ in them (set QUINEBOX_STATE_DIR elsewhere)")
        return WorldSpec(kind="overlay", layer=str(here / "upper"), work=str(here / "work"), lowers=lowers, base=(parent.session, parent.rev))
    if not isinstance(choice, list) or not choice or not all(isinstance(p, str) for p in choice):
        raise GrantError('a child\'s world is "inherit", "empty", or a list of paths in its parent\'s world')
    assert parent is not None
    paths = tuple(_world_path(p) for p in choice)
    parent.revise("fork")
    missing = [p for p in paths if p not in parent.manifest]
    if missing:
        raise GrantError(f"refused world paths: {', '.join(missing)} not in this box's world")
    return WorldSpec(kind="dir", layer=str(here / "tree"), base=(parent.session, parent.rev), paths=paths)


def _world_path(path: str) -> str:
    """`/world/a/b`, `a/b` or `./a/b` → `a/b`; refuses anything that leaves /world."""
    rel = path[len("/world/") :] if path.startswith("/world/") else path
    try:
        return "/".join(beneath.parts(rel))
    except beneath.Escape as exc:
        raise GrantError(f"refused world path {path!r}: {exc}") from None


# -- making one ------------------------------------------------------------------------


def create(session: str, spec: WorldSpec, uid: int, gid: int) -> None:
    """Make the world's directories and fill them; on any failure nothing is left behind."""
    here = world_dir(session)
    here.mkdir(parents=True, exist_ok=True)
    try:
        if spec.kind == "overlay":
            for path in (spec.layer, spec.work):
                os.mkdir(path, 0o755)
                _own(path, uid, gid)
        elif spec.kind == "dir":
            os.mkdir(spec.layer, 0o755)
            _fill(spec, uid, gid)
            _own(spec.layer, uid, gid)
        (here / "meta.json").write_text(json.dumps({"session": session, "uid": uid, "gid": gid, **_spec_fields(spec)}))
    except BaseException:
        discard(session)
        raise


def _spec_fields(spec: WorldSpec) -> dict[str, Any]:
    return {"kind": spec.kind, "layer": spec.layer, "lowers": list(spec.lowers), "work": spec.work, "base": list(spec.base) if spec.base else None}


def _own(path: str, uid: int, gid: int) -> None:
    if os.getuid() == 0:
        os.chown(path, uid, gid)


def _fill(spec: WorldSpec, uid: int, gid: int) -> None:
    fd = os.open(spec.layer, beneath.DIR_FLAGS)
    try:
        if spec.base:
            manifest = RevisionLog(spec.base[0]).manifest(spec.base[1])
            if spec.paths:
                manifest = {p: e for p, e in manifest.items() if any(p == k or p.startswith(k + "/") or k.startswith(p + "/") for k in spec.paths)}
            carry_out(manifest, ObjectStore(), fd, uid=uid, gid=gid)
        for source in spec.sources:
            target = os.path.join(spec.layer, os.path.basename(source))
            if os.path.isdir(source) and not os.path.islink(source):
                shutil.copytree(source, target, symlinks=True)
            else:
                shutil.copy2(source, target, follow_symlinks=False)
        if spec.archive:
            import_archive(spec.archive, spec.layer)
        if os.getuid() == 0 and (spec.sources or spec.archive):
            for dirpath, dirnames, filenames in os.walk(spec.layer):
                for name in dirnames + filenames:
                    os.chown(os.path.join(dirpath, name), uid, gid, follow_symlinks=False)
    finally:
        os.close(fd)


def import_archive(archive: str, into: str) -> None:
    """Unpack a tar archive into the empty directory `into`, refusing it whole if any member is unsafe.

    Python's `data` filter refuses absolute and `../` names, links that point
    outside, device files and FIFOs, and clears setuid/setgid and ownership;
    the caps on members and bytes are checked first, from the headers alone.
    """
    import tarfile

    try:
        with tarfile.open(archive) as tar:
            members, total = 0, 0
            for member in tar:
                members += 1
                total += member.size
                if members > MAX_ARCHIVE_MEMBERS:
                    raise WorldError(f"refused archive {archive}: more than {MAX_ARCHIVE_MEMBERS} members")
                if total > MAX_ARCHIVE_BYTES:
                    raise WorldError(f"refused archive {archive}: more than {MAX_ARCHIVE_BYTES} bytes")
                if member.name.startswith("/"):
                    raise WorldError(f"refused archive {archive}: {member.name} is an absolute name")
                if member.ischr() or member.isblk() or member.isfifo():
                    raise WorldError(f"refused archive {archive}: {member.name} is a device file or FIFO")
                try:
                    tarfile.data_filter(member, into)
                except tarfile.FilterError as exc:
                    raise WorldError(f"refused archive {archive}: {exc}") from None
            tar.extractall(into, filter="data")
    except (tarfile.TarError, EOFError) as exc:
        raise WorldError(f"bad archive {archive}: {exc}") from None


def discard(session: str) -> None:
    shutil.rmtree(world_dir(session), ignore_errors=True)
    try:
        session_dir(session).rmdir()  # a command's session holds nothing else
    except OSError:
        pass


def load_spec(session: str) -> tuple[WorldSpec, dict[str, Any]]:
    try:
        meta = json.loads((world_dir(session) / "meta.json").read_text())
    except FileNotFoundError:
        raise WorldError(f"session {session} has no world (a scratch world, or one already removed)") from None
    spec = WorldSpec(kind=meta["kind"], layer=meta["layer"], lowers=tuple(meta["lowers"]), work=meta["work"], base=tuple(meta["base"]) if meta["base"] else None)
    return spec, meta


# -- a world in use ---------------------------------------------------------------------


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
        self.base: Manifest = RevisionLog(spec.base[0]).manifest(spec.base[1]) if spec.kind == "overlay" and spec.base else {}
        self.tracker = None
        if track:
            from quinebox.tracker import Tracker

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
            self._append(first, self.manifest)

    @classmethod
    def offline(cls, session: str) -> "World":
        spec, _ = load_spec(session)
        return cls(session, spec, track=False)

    def _scan(self, previous: Manifest) -> Manifest:
        return dict(Scanner(self.store, previous, layer=self.spec.kind == "overlay").walk(self._root_fd))

    def _merged(self) -> Manifest:
        """The world as the box sees it, as a manifest of its own (the layer goes on changing)."""
        return merge(self.base, self.layer) if self.spec.kind == "overlay" else dict(self.layer)

    def _append(self, record: dict[str, Any], manifest: Manifest) -> dict[str, Any]:
        self.rev = record["rev"]
        self.manifest = manifest
        delta = record["changes"]
        return self.log.append({**record, "files": sum(1 for e in delta.values() if not e or e["type"] != "d"), "bytes": new_bytes(delta)})

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
            if not _differs(now, then):
                continue
            undone.append(f"removed {path} (made after revision {rev})" if then is None else f"brought back {path}" if now is None else f"restored {path}")
        return {**plan, "revision": rev, "before": self.rev, "undone": undone}, data

    def adopt_plan(self, child: str, *, force: bool = False) -> tuple[dict[str, Any], Iterator[bytes]]:
        """What carries a finished child's changes into this (running) world, for the guest to carry out."""
        delta, base = child_changes(child, inherited(child, self.session))
        self.revise("before adopt")
        _refuse_conflicts(child, delta, changes(base, self.manifest), force)
        plan, data = self.plan(apply(self.manifest, delta))
        return {**plan, "adopted": [f"{code} {path}" for code, path in describe(base, delta)]}, data

    def plan(self, target: Manifest) -> tuple[dict[str, Any], Iterator[bytes]]:
        """The steps from this world's newest revision to `target`; the guest takes them inside the box,
        where the kernel (and overlay) see every write. Files whose bytes were not kept are left as they are."""
        current = self.manifest
        remove = [p for p, e in current.items() if p not in target or target[p]["type"] != e["type"] or (e["type"] == "l" and target[p] != e)]
        remove = [p for p in sorted(remove) if not any(p.startswith(r + "/") for r in remove if r != p)]
        dirs = [[p, e["mode"]] for p, e in sorted(target.items()) if e["type"] == "d" and current.get(p) != e]
        links = [[p, e["target"]] for p, e in sorted(target.items()) if e["type"] == "l" and current.get(p) != e]
        files = [(p, e) for p, e in sorted(target.items()) if e["type"] == "f" and e.get("sha") and not _same_file(current.get(p), e)]
        plan = {
            "kind": "world_plan",
            "remove": remove,
            "dirs": dirs,
            "links": links,
            "files": [[p, e["mode"], e["size"], e.get("mtime", 0)] for p, e in files],
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


def _same_file(current: dict[str, Any] | None, target: dict[str, Any]) -> bool:
    return bool(current) and current["type"] == "f" and current.get("sha") == target["sha"] and current["mode"] == target["mode"]


def _differs(now: dict[str, Any] | None, then: dict[str, Any] | None) -> bool:
    """Whether restoring would change this path (a directory's mode or a file's mtime alone do not count)."""
    if now is None or then is None:
        return now is not then
    if now["type"] != then["type"]:
        return True
    return (then["type"] == "f" and not _same_file(now, then)) or (then["type"] == "l" and now != then)


def open_world(spec: BoxSpec, on_full: Callable[[str], None]) -> World:
    """Make a box's world and start tracking it, before its container exists."""
    from quinebox.policy import DEFAULT_WORLD

    assert spec.world is not None
    if not world_dir(spec.session).joinpath("meta.json").exists():
        create(spec.session, spec.world, spec.uid, spec.gid)
    try:
        return World(spec.session, spec.world, limit=spec.grants.world or DEFAULT_WORLD, on_full=on_full)
    except BaseException:
        discard(spec.session)
        raise


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


# -- adopting a child's changes ------------------------------------------------------------


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


def _refuse_conflicts(child: str, delta: Changes, ours: Changes, force: bool) -> None:
    conflicts = sorted(p for p in delta if p in ours and ours[p] != delta[p])
    if conflicts and not force:
        shown = ", ".join(conflicts[:10]) + (f" and {len(conflicts) - 10} more" if len(conflicts) > 10 else "")
        raise ConflictError(f"refused to adopt {child}: its parent changed {shown} too since the fork; --force takes the child's")


def adopt(child: str, *, force: bool = False, parent_running: bool = False) -> tuple[str, list[tuple[str, str]]]:
    """Merge what an ended `child` changed in its inherited world into its parent's; (parent, [(A|M|D, path)]).

    A path the parent changed too since the fork is a conflict: refused unless `force`, when the child's wins.
    """
    spec = inherited(child)
    assert spec.base is not None
    parent = spec.base[0]
    parent_spec, parent_meta = load_spec(parent)
    if parent_running and parent_spec.kind == "overlay":
        raise WorldError(f"the parent {parent} is still running in a copy-on-write world: adopt after it ends")
    mine = World.offline(child)
    try:
        mine.revise("adopt")
    finally:
        mine.close()
    delta, base = child_changes(child, spec)
    theirs = World.offline(parent)
    try:
        theirs.revise("before adopt")
        _refuse_conflicts(child, delta, changes(base, theirs.manifest), force)
        _apply(theirs, delta, uid=parent_meta["uid"], gid=parent_meta["gid"])
        theirs.revise(f"adopt {child}")
        return parent, describe(base, delta)
    finally:
        theirs.close()


def _apply(world: World, delta: Changes, *, uid: int, gid: int) -> None:
    """Carry `delta` out in `world`'s own layer (its box has ended), beneath its root."""

    def whiteout(dir_fd: int, name: str, path: str) -> None:
        if world.spec.kind == "overlay" and path in world.base:  # still there below: overlay must hide it
            try:
                os.mknod(name, stat.S_IFCHR, os.makedev(0, 0), dir_fd=dir_fd)
            except PermissionError:
                raise WorldError(f"cannot delete {path} from a copy-on-write world without CAP_MKNOD (run the adopt as root)") from None

    carry_out(delta, world.store, world._root_fd, uid=uid, gid=gid, hide=whiteout)


def export(session: str, rev: int | None, out) -> list[str]:
    """A revision of a world as a tar stream on `out`; the paths whose bytes were not kept."""
    from quinebox.revisions import exported

    manifest = RevisionLog(session).manifest(rev)
    return exported(manifest, ObjectStore(), out)


"""Choosing a world: where a box's /world comes from, checked before anything is made.

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
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from quinebox.errors import ErrorKind, GrantError
from quinebox.grants import Mount, check_mount
from quinebox.state import session_dir
from quinebox.worlds import beneath
from quinebox.worlds.revisions import Manifest, WorldError

#: Characters overlay's mount options cannot carry in a path.
_OVERLAY_UNSAFE = set(",:\\\n")


@dataclass(frozen=True)
class WorldSpec:
    """Where a box's /world comes from; `layer` is the host directory the box writes to.

    kind "dir": a directory of its own under the state dir, seeded from `base`
    (all of it, or only `paths`), from host `sources`, from an `archive`, or
    empty. "bind": the caller's own directory, read-write. "overlay": a
    copy-on-write view of `lowers` (a parent's world), writes going to `layer`.
    """

    kind: str
    layer: str
    lowers: tuple[str, ...] = ()
    work: str | None = None
    #: (session, revision) the world starts from: an overlay's parent, or the revision a dir is filled from.
    base: tuple[str, int] | None = None
    paths: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    archive: str | None = None


class ParentWorld(Protocol):
    """What a child's world is chosen from: its parent's `world.World` while that box runs, described here
    because world.py builds on this module and so is never imported by it."""

    session: str
    spec: WorldSpec
    rev: int
    manifest: Manifest

    def revise(self, what: str) -> dict[str, Any] | None: ...


def world_dir(session: str) -> Path:
    return session_dir(session) / "world"


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
        raise GrantError(f"give one of --world, --world-from and --world-tar, not {' and '.join(chosen)}", kind=ErrorKind.BAD_INPUT, options=chosen)
    tree = str(world_dir(session) / "tree")
    if world_at:
        return WorldSpec(kind="dir", layer=tree, base=world_at)
    if world:
        return WorldSpec(kind="bind", layer=_host_path(world, cwd, protected, "--world", directory=True))
    if world_tar:
        path = os.path.join(cwd, os.path.expanduser(world_tar))
        if not os.path.isfile(path):
            raise GrantError(f"bad --world-tar {world_tar!r}: no such archive file", kind=ErrorKind.NOT_FOUND, option="--world-tar", path=path)
        return WorldSpec(kind="dir", layer=tree, archive=os.path.realpath(path))
    choice = [world_from] if isinstance(world_from, str) else list(world_from or [])
    if not choice or choice == ["empty"]:
        return WorldSpec(kind="dir", layer=tree)
    if choice == ["inherit"]:
        raise GrantError("--world-from inherit: a box started here has no parent world; use --world DIR to work on a directory, or --world-from PATH... to copy paths in",
                         kind=ErrorKind.BAD_INPUT, option="--world-from")
    sources = tuple(_host_path(p, cwd, protected, "--world-from") for p in choice)
    names = [os.path.basename(s) for s in sources]
    if len(set(names)) != len(names):
        raise GrantError(f"--world-from {' '.join(choice)}: two paths would land on the same name in the world", kind=ErrorKind.CONFLICT, option="--world-from")
    return WorldSpec(kind="dir", layer=tree, sources=sources)


def _host_path(path: str, cwd: str, protected: list[str], option: str, *, directory: bool = False) -> str:
    full = os.path.normpath(os.path.join(cwd, os.path.expanduser(path)))
    if not os.path.lexists(full):
        raise GrantError(f"bad {option} {path!r}: {full} does not exist", kind=ErrorKind.NOT_FOUND, option=option, path=full)
    if directory and not os.path.isdir(full):
        raise GrantError(f"bad {option} {path!r}: {full} is not a directory", kind=ErrorKind.BAD_INPUT, option=option, path=full)
    return check_mount(Mount(source=full, dest="/world", writable=True), protected=protected).source


def child_world(parent: ParentWorld | None, session: str, choice: Any) -> WorldSpec:
    """A child's world from its request's `world`: "inherit" (the default), "empty", or a list of paths in the parent's."""
    choice = "inherit" if choice is None else choice
    if parent is None and choice != "empty":
        raise GrantError("this box has no world to pass on: ask for world \"empty\"", kind=ErrorKind.BAD_INPUT)
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
        raise GrantError('a child\'s world is "inherit", "empty", or a list of paths in its parent\'s world', kind=ErrorKind.BAD_INPUT)
    assert parent is not None
    paths = tuple(_world_path(p) for p in choice)
    parent.revise("fork")
    missing = [p for p in paths if p not in parent.manifest]
    if missing:
        raise GrantError(f"refused world paths: {', '.join(missing)} not in this box's world", kind=ErrorKind.NOT_FOUND, paths=missing)
    return WorldSpec(kind="dir", layer=str(here / "tree"), base=(parent.session, parent.rev), paths=paths)


def _world_path(path: str) -> str:
    """`/world/a/b`, `a/b` or `./a/b` → `a/b`; refuses anything that leaves /world."""
    rel = path[len("/world/") :] if path.startswith("/world/") else path
    try:
        return "/".join(beneath.parts(rel))
    except beneath.Escape as exc:
        raise GrantError(f"refused world path {path!r}: {exc}", kind=ErrorKind.REFUSED, path=path) from None

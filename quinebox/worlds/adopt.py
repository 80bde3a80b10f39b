"""Adopting a child's changes: what a child changed in its inherited world, merged into its parent's.

A path the parent changed too since the fork is a conflict, refused unless forced.
"""

from __future__ import annotations

import os
import stat

from quinebox.audit import log
from quinebox.worlds.build import load_spec
from quinebox.worlds.materialize import carry_out
from quinebox.worlds.revisions import Changes, WorldError, changes, describe
from quinebox.worlds.world import World, child_changes, inherited, refuse_conflicts


def adopt(child: str, *, force: bool = False, parent_running: bool = False) -> tuple[str, list[tuple[str, str]], list[str]]:
    """Merge what an ended `child` changed in its inherited world into its parent's;
    (parent, [(A|M|D, path)], `path (why)` for each change that could not be made: see `unkept`).

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
        refuse_conflicts(child, delta, changes(base, theirs.manifest), force)
        missing = _apply(theirs, delta, uid=parent_meta["uid"], gid=parent_meta["gid"])
        theirs.revise(f"adopt {child}")
        described = describe(base, delta)
        log.note("world_adopted", parent, by="host", child=child, force=force, changes=len(described), not_made=missing)
        return parent, described, missing
    finally:
        theirs.close()


def _apply(world: World, delta: Changes, *, uid: int, gid: int) -> list[str]:
    """Carry `delta` out in `world`'s own layer (its box has ended), beneath its root."""

    def whiteout(dir_fd: int, name: str, path: str) -> None:
        if world.spec.kind == "overlay" and path in world.base:  # still there below: overlay must hide it
            try:
                os.mknod(name, stat.S_IFCHR, os.makedev(0, 0), dir_fd=dir_fd)
            except PermissionError:
                raise WorldError(f"cannot delete {path} from a copy-on-write world without CAP_MKNOD (run the adopt as root)") from None

    return carry_out(delta, world.store, world._root_fd, uid=uid, gid=gid, hide=whiteout)

"""Garbage collection: what a quinebox process that is gone left behind — its boxes, their cgroups, bundles and
sockets, stale claim records and spools — and unpacked images no box uses that went, went unused or changed
(`prune_images`, which `quinebox prune` runs too).

Each orphaned box is removed through its own object (`Box.destroy`, the one way for every backend); one whose
backend would not remove it (a delete that failed or timed out) stays listed, is told to `unremoved`, and is
never counted as removed: the next `gc` tries it again.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from quinebox.box.backends.boxes import Box
from quinebox.box.backends.keeper import keeper_runs
from quinebox.box.backends.oci import idmap
from quinebox.box.backends.oci.boxroot import bundle_of, bundles, remove_bundle, sweep_layers
from quinebox.box.backends.oci.policy import Rootless
from quinebox.box.backends.rootless import delegated_name, local_rootless
from quinebox.box.owners.listing import every_box, info, reachable_engine
from quinebox.box.policy import CGROUP_PREFIX, LABEL_OWNER
from quinebox.box.shape import POOL_SESSION
from quinebox.errors import EngineError, QuineboxError
from quinebox.processes import owner_alive
from quinebox.state import cluster_dir, pool_dir, run_dir

if TYPE_CHECKING:
    from quinebox.box.backends.docker.engine import DockerBackend
    from quinebox.box.images.eviction import Evicted

#: How old an empty cgroup or an ownerless bundle no runtime knows must be before `gc` takes it (one being made now is not yet known).
STALE = 60.0
#: How long a resume lets a lost process's keeper or the engine remove its box before doing it itself (clear_session).
SETTLE = 15.0

Said = Callable[[str, str], None]


def collect_garbage(backend: DockerBackend | None = None, *, evicted: Said | None = None, unremoved: Said | None = None) -> list[str]:
    """Remove boxes (and sockets) whose owner is gone; return the sessions of those removed. A box its backend
    would not remove is told to `unremoved(session, why)` instead. Unpacked images no box uses that went, went
    unused or changed are removed too (`prune_images`), each told to `evicted(image directory, why)`."""
    engine = reachable_engine(backend)
    removed = []
    live_sessions = set()
    boxes = every_box(engine, connect=False)
    for box in boxes:
        row = info(box)
        if owner_alive(row.owner):
            live_sessions.add(row.session)
        elif box.destroy():
            removed.append(row.session)
        elif unremoved is not None:
            unremoved(row.session, f"its backend ({box.backend}) refused to remove it or did not answer in time; it stays listed for the next `quinebox gc`")
    for image in prune_images(boxes, engine):
        if evicted is not None:
            evicted(image.name, image.why)
    known = {box.session for box in boxes}  # what is still listed keeps its cgroup and bundle
    sweep_cgroups(known)
    _sweep_bundles(known)
    sweep_layers()  # rootless layers in /dev/shm whose bundle went without them
    idmap.sweep()  # the machine's slots of host ids whose boxes are gone, whoever's state dir made them
    present = {box.id for box in boxes}
    for record in run_dir().glob("claimed/*.json"):
        if record.stem not in present:
            record.unlink(missing_ok=True)
    for world in pool_dir().glob("*"):
        if POOL_SESSION + world.name not in live_sessions:
            shutil.rmtree(world, ignore_errors=True)
    for spool in cluster_dir().glob("*"):  # a cluster driver's staging, a node's attempts: PID-START of their process
        pid, _, start = spool.name.partition("-")
        if not owner_alive(f"{socket.gethostname()}:{pid}:{start}"):
            shutil.rmtree(spool, ignore_errors=True)
    for sock in run_dir().glob("*.sock"):
        if sock.stem not in live_sessions:
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(str(sock))
            except OSError:
                sock.unlink(missing_ok=True)
            finally:
                probe.close()
    return removed


def clear_session(session: str, engine: DockerBackend | None = None, *, settle: float = SETTLE) -> None:
    """Wait until what a process that is gone left of `session`'s box (the box, where a backend still lists it, and
    its bundle) is gone, so that the session may start a box again under its own name: a resumed session's.

    The lost process's keeper (backends/keeper.py) or the engine is most often removing that box as this runs: they are let
    finish, so that no late delete of theirs meets the new box of the same name. What nobody is left to remove (no
    keeper runs here: after a reboot, say) or is still there after `settle` seconds is removed here. A box of the
    session whose owner still runs is left alone, and said (QuineboxError)."""
    engine = reachable_engine(engine)
    waited = time.monotonic() + settle
    while True:
        boxes = [box for box in every_box(engine, connect=False) if info(box).session == session]
        for box in boxes:
            owner = info(box).owner
            if owner_alive(owner):
                raise QuineboxError(f"session {session} still has a box ({box.id}) whose process runs ({owner})")
        bundle = bundle_of(session)
        if not boxes and not bundle.exists():
            return
        if time.monotonic() > waited + settle:
            raise QuineboxError(f"the box session {session} had is still there after {2 * settle:g} s: `quinebox gc` removes it, then resume again")
        if time.monotonic() > waited or not keeper_runs():
            for box in boxes:
                box.destroy()
            made_by = bundle_owner(bundle)
            if not boxes and bundle.exists() and (made_by is None or not owner_alive(made_by)):
                remove_bundle(bundle)
        time.sleep(0.1)


def _sweep_bundles(known: set[str]) -> None:
    """Remove bundles of boxes no runtime lists (not among `known` sessions) whose owner is gone: what an owner and
    its keeper both killed mid-start leave, a box's root still mounted maybe. One with no owner to read goes once a
    minute old (one is written before its box is made)."""
    for session, bundle in bundles():
        if session in known:
            continue
        owner = bundle_owner(bundle)
        try:
            young = time.time() - bundle.stat().st_mtime < STALE
        except OSError:
            continue
        if owner_alive(owner) if owner is not None else young:
            continue
        remove_bundle(bundle)


def sweep_cgroups(known: set[str]) -> list[str]:
    """Remove box cgroups left empty with no runtime state naming them (a delete that raced a dead owner's init
    may leave one), each a minute old or more and not among `known` sessions; and /quinebox, the parent boxes
    shared before each had a cgroup of its own. rmdir takes only an empty cgroup, so no box that still has a
    process loses its own. Returns the names of the cgroups that went."""
    root = Path("/sys/fs/cgroup")
    # A rootless box's lies in its user's delegated cgroup (backends/rootless.py): v1's in each hierarchy, v2's one.
    delegated = [f"*/{delegated_name(os.getuid())}/", f"{delegated_name(os.getuid())}/"]
    who = local_rootless()
    if isinstance(who, Rootless) and not who.cgroup.startswith(f"/{delegated_name(os.getuid())}"):
        delegated.append(who.cgroup.strip("/") + "/")
    patterns = ["*/", "", *delegated]
    boxes = [g for pattern in patterns for g in root.glob(f"{pattern}{CGROUP_PREFIX}*") if g.name[len(CGROUP_PREFIX) :] not in known]
    removed: set[str] = set()
    for group in [*root.glob("*/quinebox"), root / "quinebox", *boxes]:
        try:
            if group.name != "quinebox" and time.time() - group.stat().st_mtime < STALE:
                continue
            os.rmdir(group)
        except OSError:
            continue  # busy (it has processes or children), not a directory, or gone already
        removed.add(group.name)
    return sorted(removed)


def bundle_owner(bundle: Path) -> str | None:
    """The owner label a bundle's config names; None when it has none to read (a bundle being written, or debris)."""
    try:
        return str(json.loads((bundle / "config.json").read_text())["annotations"][LABEL_OWNER])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def prune_images(boxes: list[Box], engine: DockerBackend | None, *, dry: bool = False) -> list[Evicted]:
    """The image step of both `gc` and `prune`: remove (with `dry`, only weigh) the unpacked images that no box of
    `boxes` (every box listed) uses and that went, went unused or changed (images/eviction.py). `engine`: the
    engine, if one answers; without it, which images went is read from the names the cache and the engine's table
    hold."""
    from quinebox.box.images import eviction

    in_use = {os.path.basename(os.path.dirname(box.image_root)) for box in boxes if box.image_root}
    try:
        engine_ids = engine.image_ids() if engine is not None else None
    except EngineError:
        engine_ids = None
    return eviction.evict(in_use, engine_ids, dry=dry)

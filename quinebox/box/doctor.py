"""`quinebox doctor`: each way a box could run here, whether it works and what fixes it; whether the default way is ready;
which backend `auto` picks here and why (and where bubblewrap, the fastest where it is usable, stands on its ladder).

Exit 0 when the way boxes get by default (`--backend auto` unless configured) works and has the agent image
(so at least one way works), 1 otherwise. A way that does not work but is not the default (crun not
installed, say) is listed with its fix and fails nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape

from quinebox.box.backends.ways import BWRAP, ENGINE, RUNTIME_NAMES, Way, local_bwrap_way, local_engine_way, local_runtime_way
from quinebox.box.spec import DEFAULT_IMAGE
from quinebox.errors import QuineboxError

if TYPE_CHECKING:
    from quinebox.box.backends.docker.engine import DockerBackend

MARKS = {"ok": "[green]ok[/green]  ", "no": "[yellow]no[/yellow]  ", "FAIL": "[red]FAIL[/red]", "note": "note"}

Say = Callable[..., None]


def run() -> int:
    console = Console(stderr=True, highlight=False)

    def say(mark: str, what: str, fix: str = "") -> None:
        console.print(f"{MARKS[mark]} {escape(what)}" + (f"\n      → {escape(fix)}" if fix else ""), soft_wrap=True)

    from quinebox.box.backends.watch import recent_incidents

    for incident in recent_incidents():
        when = datetime.fromtimestamp(incident["t"]).strftime("%Y-%m-%d %H:%M:%S")
        say("note", f"{when} {incident.get('backend') or 'the engine'} failed quinebox: {incident.get('what')}")
    connected: list[DockerBackend] = []

    def connect() -> DockerBackend:
        from quinebox.box.backends.docker.engine import DockerBackend

        connected.append(DockerBackend.connect(timeout=10))
        return connected[0]

    console.print("ways a box can run here:")
    from quinebox.box.backends.choice import usable

    ways = [local_bwrap_way()] + [local_runtime_way(name, usable) for name in RUNTIME_NAMES] + [local_engine_way(connect)]
    for way in ways:
        say("ok" if way.works else "no", f"{way.label}: {way.what}", "" if way.works else way.fix)
    engine = next(way for way in ways if way.name == ENGINE)
    backend = connected[0] if engine.works else None
    ready = default_ready(say, ways, backend)
    _auto(say, ways)
    _moves(say)
    _snapshots(say, ways, backend)
    if backend is not None:
        _orphans(say, backend)
    if os.geteuid() == 0:
        _own_ids(say, backend)
    return 0 if ready and any(way.works for way in ways) else 1


def _own_ids(say: Say, backend: DockerBackend | None) -> None:
    """As root: whose ids a box runs as (backends/oci/idmap.py), on a runtime and on the engine."""
    from quinebox.box.backends.oci import idmap

    first, last = idmap.BASE, idmap.BASE + idmap.SLOTS * idmap.SPAN - 1
    say("note", f"running as root: a box on runc runs in a user namespace of its own, its user a host uid of quinebox's range {first}…{last} "
        "(no account's; its children share it): rw: grants must be writable by it (e.g. mode 1777, or an ACL); gVisor's boxes are its sandbox's")
    if backend is None:
        return
    try:
        remapped = backend.remaps_users()
    except QuineboxError:
        return
    if remapped:  # its boxes' host uids are the engine's remapped ones, which quinebox does not hand its sockets and worlds
        say("no", "the Docker engine remaps users (dockerd --userns-remap): its boxes cannot reach their sockets and worlds, which are uid 1000's",
            "use bwrap or runc (auto's choice wherever either runs), or run dockerd without --userns-remap for quinebox")
    else:
        say("no", "the Docker engine runs boxes without a user namespace: a root-made box on it runs as host uid 1000, which may be an account's",
            "use bwrap or runc (auto's choice wherever either runs), whose boxes have host ids of their own")


def default_ready(say: Say, ways: list[Way], backend: DockerBackend | None) -> bool:
    """Says which way boxes get by default and whether it is ready (it works, and the agent image is there)."""
    from quinebox.box.backends import registry
    from quinebox.box.backends.choice import choose

    try:
        choice = choose(None, known=registry.NAMES)
    except QuineboxError as exc:
        say("FAIL", f"default: {exc}", "name a runtime that works here, or none (--runtime, QUINEBOX_RUNTIME or runtime: in config.yaml)")
        return False
    way = registry.backend(choice.backend).doctor_way(choice, ways)
    if not way.works:
        say("FAIL", f"default: {choice.why}; and {'the ' * (way.name == ENGINE)}{way.label} cannot run boxes here: {way.what}", way.fix)
        return False
    say("ok", f"default: {choice.why}")
    engine = next(w for w in ways if w.name == ENGINE)
    return _image_ready(say, registry.backend(choice.backend).unpacks_images, backend, build="build it: quinebox image build" if engine.works else
                        f"the engine builds it, and {engine.what}: {engine.fix}; then quinebox image build (or unpack a saved one: quinebox image load FILE)")


def _auto(say: Say, ways: list[Way]) -> None:
    """Which backend `auto` picks here and why, and whether bubblewrap, the fastest backend where it is usable, is."""
    from quinebox.box.backends import registry
    from quinebox.box.backends.choice import choose

    try:
        picked = choose(None, known=registry.NAMES, backend="auto")
    except QuineboxError as exc:
        say("note", f"auto: {exc}")
        return
    bwrap = next(way for way in ways if way.name == BWRAP)
    here = "usable here" if bwrap.works else "not usable here"
    say("note", f"auto: {picked.why} (bwrap, the fastest backend where it is usable, is {here})")


def _moves(say: Say) -> None:
    """Whether a box's start waits on the kernel to move its first process into the box's cgroup, and what stops it."""
    from quinebox.box.backends.exec_cgroups import local_waiting_moves

    try:
        fix = local_waiting_moves()
    except OSError:
        return
    if fix is None:
        say("ok", "cgroup moves: a box's start does not wait for the kernel to move its first process into its cgroup")
    else:
        say("no", "cgroup moves: each box's start waits ~10 ms for the kernel to move its first process into its cgroup (an RCU grace period)",
            f"{fix}; forks and exits then cost a little more")


def _image_ready(say: Say, unpacked: bool, backend: DockerBackend | None, *, build: str) -> bool:
    """Looks where `exec` looks (configure.unpacked_image), in its order and with its own lookups: this user's
    cache; the engine when it answers; else the machine's shared cache root fills (shared.py). Where it is
    nowhere, the fix is the one that works for this user: root shares it for a user with no engine to ask."""
    from quinebox.box.images import rootfs, shared
    from quinebox.box.images.agent_image import image_exists

    if unpacked:
        known = rootfs.lookup(DEFAULT_IMAGE)
        if known is not None and rootfs.unpacked(known.id) is not None:
            say("ok", f"image {DEFAULT_IMAGE} unpacked for OCI boxes ({rootfs.unpacked(known.id)})")
            return True
        if backend is not None:
            if image_exists(backend, DEFAULT_IMAGE):
                say("ok", f"image {DEFAULT_IMAGE} present in the engine (unpacked for OCI boxes on first use)")
                return True
            say("FAIL", f"image {DEFAULT_IMAGE} is not here (neither unpacked nor in the engine)", build)
            return False
        public = shared.lookup(DEFAULT_IMAGE)
        if public is not None:
            say("ok", f"image {DEFAULT_IMAGE} in the machine's shared image cache ({public[1]}; copied into yours on first use)")
            return True
        say("FAIL", f"image {DEFAULT_IMAGE} is not here (not unpacked, not in the shared image cache {shared.shared_root()}, and no engine to ask)",
            build if os.geteuid() == 0 else f"have root share it: sudo quinebox image share {DEFAULT_IMAGE}")
        return False
    assert backend is not None  # the engine way works, so it answered
    if not image_exists(backend, DEFAULT_IMAGE):
        say("FAIL", f"image {DEFAULT_IMAGE} is not in the engine", build)
        return False
    say("ok", f"image {DEFAULT_IMAGE} present in the engine")
    from quinebox.box.images.guest_runtime import runtime_dir

    try:
        where = runtime_dir(backend, DEFAULT_IMAGE)
    except QuineboxError as exc:
        say("FAIL", f"guest runtime: {exc}", build)
        return False
    say("ok", f"guest runtime for any image at {where}")
    return True


def _snapshots(say: Say, ways: list[Way], backend: DockerBackend | None) -> None:
    """Where a long-lived box can be snapshotted (`quinebox box checkpoint`): runsc here; runc through CRIU, if
    `criu check` passes; the engine in its experimental mode, whose checkpoints quinebox does not take."""
    from quinebox.box.backends.oci.criu import criu_fails
    from quinebox.box.backends.oci.runtime import Runtime
    from quinebox.errors import EngineError

    say("note", "snapshots (box checkpoint, restore, fork):")
    for way in ways:
        if not way.works:
            continue
        if way.name == BWRAP:
            say("no", f"{way.label}: quinebox takes no snapshots of its boxes", "make boxes to snapshot with --runtime runsc")
        elif way.name != ENGINE and Runtime(way.name, "").capabilities.checkpoint:
            say("ok", f"{way.label}: {way.name} checkpoint and restore")
        elif way.name == ENGINE:
            try:
                experimental = backend.experimental() if backend is not None else False
            except EngineError:
                experimental = False
            say("no", f"{way.label}: its checkpoints are experimental ({'on' if experimental else 'off'} here) and go through CRIU; quinebox does not take them",
                "make boxes to snapshot with --runtime runsc")
        else:
            criu = criu_fails()
            say("no", f"{way.label}: checkpoints go through CRIU, and {criu or 'quinebox takes them on gVisor only'}", "make boxes to snapshot with --runtime runsc")


def _orphans(say: Say, backend: DockerBackend) -> None:
    from quinebox.box.owners.listing import live_boxes
    from quinebox.processes import owner_alive

    try:
        orphans = [box.session for box in live_boxes(backend) if not owner_alive(box.owner)]
    except QuineboxError as exc:
        say("note", f"cannot list boxes: {exc}")
        return
    if orphans:
        say("note", f"{len(orphans)} orphaned box(es) left (their quinebox process is gone)", "quinebox gc removes them")
    else:
        say("ok", "no orphaned boxes (their quinebox process is gone)")

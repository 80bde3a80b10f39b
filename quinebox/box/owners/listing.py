"""The boxes of every backend, seen through their labels: listing and garbage collection.

There is no daemon: each quinebox process owns its boxes, and a box's owner
label (`host:pid:start`) is enough to tell whether that process still lives.
On the engine the labels are the container's; on an OCI runtime they are the
same names as annotations, which the runtime's `list` shows (ocibox.oci_containers).
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone

from typing import TYPE_CHECKING, Any, Callable

from quinebox.audit import log
from quinebox.box.backends.boxroot import remove_bundle
from quinebox.box.backends.ocibox import STALE, bundle_owner, oci_containers, oci_runtime, sweep_cgroups
from quinebox.box.pool.claim import claimed_as
from quinebox.box.policy import AGENT_COMMAND, GUEST_PREFIX, LABEL_CREATED, LABEL_OWNER, LABEL_PARENT, LABEL_SESSION, LABEL_USER
from quinebox.box.shape import LABEL_POOL, POOL_SESSION
from quinebox.errors import EngineError
from quinebox.processes import owner_alive
from quinebox.state import cluster_dir, pool_dir, run_dir

if TYPE_CHECKING:
    from quinebox.box.backends.docker import DockerBackend

#: What a claim record says over a warm box's labels.
_RECORDED = {"session": LABEL_SESSION, "owner": LABEL_OWNER, "parent": LABEL_PARENT, "created": LABEL_CREATED}


@dataclass(frozen=True)
class BoxInfo:
    session: str
    container: str
    command: str
    state: str
    owner: str
    parent: str
    age_s: float
    #: The uid of whoever started it ("" for a box from before quinebox recorded it).
    user: str = ""
    #: "docker", or the OCI runtime it runs on.
    backend: str = "docker"






def _info(container: dict) -> BoxInfo:
    labels = container.get("Labels") or {}
    command = container.get("Command", "")
    if LABEL_POOL in labels:  # a warm box: once claimed, its record says whose it is now
        record = claimed_as(container["Id"]) or {}
        command = record.get("command", command)
        labels = {**labels, **{label: record[key] for key, label in _RECORDED.items() if key in record}}
    for prefix, shown in ((" ".join(GUEST_PREFIX) + " ", ""), (" ".join(AGENT_COMMAND) + " ", "run: ")):
        if command.startswith(prefix):
            command = shown + command[len(prefix) :]
    created = labels.get(LABEL_CREATED, "")
    try:
        age = (datetime.now(timezone.utc) - datetime.fromisoformat(created)).total_seconds()
    except ValueError:
        age = time.time() - container.get("Created", time.time())
    return BoxInfo(
        session=labels.get(LABEL_SESSION, "?"),
        container=container["Id"] if "Runtime" in container else container["Id"][:12],
        command=command,
        state=container.get("State", "?"),
        owner=labels.get(LABEL_OWNER, "?"),
        parent=labels.get(LABEL_PARENT, ""),
        age_s=max(0.0, age),
        user=labels.get(LABEL_USER, ""),
        backend=container.get("Runtime", "docker"),
    )


def _containers(backend: DockerBackend | None, *, engine: bool = True) -> list[dict[str, Any]]:
    """Every quinebox box, on the engine (unless `engine` is False) and on each OCI runtime used here. An engine
    that does not answer is an error only when nothing else can be listed: a machine may run boxes with no engine."""
    on_runtimes = oci_containers()
    if backend is None and not engine:
        return on_runtimes
    try:
        if backend is None:
            from quinebox.box.backends.docker import DockerBackend

            backend = DockerBackend.connect()
        return backend.boxes() + on_runtimes
    except EngineError:
        if on_runtimes or backend is None and os.environ.get("QUINEBOX_BACKEND") == "oci":
            return on_runtimes
        raise


def _kill(box: BoxInfo, backend: DockerBackend | None) -> None:
    if box.backend != "docker":
        oci_runtime(box.backend).kill(box.container)
    elif backend is not None:
        backend.kill(box.container)


def _remove(container: dict[str, Any], backend: DockerBackend | None) -> None:
    runtime = container.get("Runtime", "docker")
    if runtime != "docker":
        oci_runtime(runtime).delete(container["Id"])
        remove_bundle(run_dir() / f"{container['Labels'].get(LABEL_SESSION, '?')}.oci")
    elif backend is not None:
        backend.remove(container["Id"])


def live_boxes(backend: DockerBackend | None = None) -> list[BoxInfo]:
    """Every box that runs something: warm boxes not yet claimed are the pool's, not anyone's command."""
    boxes = (_info(c) for c in _containers(backend))
    return sorted((box for box in boxes if not box.session.startswith(POOL_SESSION)), key=lambda b: -b.age_s)


def is_running(session: str, backend: DockerBackend | None = None) -> bool:
    """Whether the box of `session` is still there (its world may still change)."""
    return any(_info(c).session == session for c in _containers(backend))


def collect_garbage(backend: DockerBackend | None = None, *, repaired: Callable[[str, str], None] | None = None) -> list[str]:
    """Remove boxes (and sockets) whose owner is gone; return their session ids. Unpacked images that changed since
    their unpack are removed too, each told to `repaired(image directory, why)`."""
    backend = _engine(backend)
    removed = []
    live_sessions = set()
    containers = _containers(backend, engine=False)
    for container in containers:
        box = _info(container)
        if owner_alive(box.owner):
            live_sessions.add(box.session)
            continue
        _remove(container, backend)
        removed.append(box.session)
    for name, why in _prune_images(containers, backend):
        if repaired is not None:
            repaired(name, why)
    on_runtimes = {container["Labels"].get(LABEL_SESSION, "") for container in containers if container.get("Runtime")}
    sweep_cgroups(on_runtimes)
    _sweep_bundles(on_runtimes)
    present = {container["Id"] for container in containers}
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


def _sweep_bundles(known: set[str]) -> None:
    """Remove bundles of boxes no runtime lists (not among `known` sessions) whose owner is gone: what an owner and
    its keeper both killed mid-start leave, a box's root still mounted maybe. One with no owner to read goes once a
    minute old (one is written before its box is made)."""
    for bundle in sorted(run_dir().glob("*.oci")):
        if bundle.stem in known:
            continue
        owner = bundle_owner(bundle)
        try:
            young = time.time() - bundle.stat().st_mtime < STALE
        except OSError:
            continue
        if owner_alive(owner) if owner is not None else young:
            continue
        remove_bundle(bundle)


def _engine(backend: DockerBackend | None) -> DockerBackend | None:
    """The engine, if one answers: killing and collecting go on for the runtimes' boxes without it."""
    if backend is not None:
        return backend
    from quinebox.box.backends.docker import DockerBackend

    try:
        return DockerBackend.connect()
    except EngineError:
        return None


def _prune_images(containers: list[dict[str, Any]], backend: DockerBackend | None) -> list[tuple[str, str]]:
    """Remove unpacked images that no live box uses and whose image is gone or replaced (see rootfs.prune), and
    those changed since their unpack (rootfs.repair): (directory, why) of each of the latter."""
    from quinebox.box.images import rootfs

    in_use = {os.path.basename(os.path.dirname(c["Rootfs"])) for c in containers if c.get("Rootfs")}
    try:
        engine_ids = backend.image_ids() if backend is not None else None
    except EngineError:
        engine_ids = None
    rootfs.prune(in_use, rootfs.current_ids(engine_ids))
    return rootfs.repair(in_use)


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def as_tree(rows: list[BoxInfo]) -> list[tuple[int, BoxInfo]]:
    """Boxes in tree order (each after its parent), with their depth; orphans of gone parents are roots."""
    sessions = {box.session for box in rows}
    children: dict[str, list[BoxInfo]] = {}
    for box in rows:
        children.setdefault(box.parent if box.parent in sessions else "", []).append(box)
    ordered: list[tuple[int, BoxInfo]] = []
    stack = [(0, box) for box in reversed(children.get("", []))]
    while stack:
        depth, box = stack.pop()
        ordered.append((depth, box))
        stack += [(depth + 1, child) for child in reversed(children.get(box.session, []))]
    return ordered


def subtree(rows: list[BoxInfo], session: str) -> list[BoxInfo]:
    """The box whose session starts with `session`, and every box below it."""
    matches = [box for box in rows if box.session.startswith(session)]
    if len(matches) != 1:
        return []
    found, frontier = [matches[0]], [matches[0].session]
    while frontier:
        parent = frontier.pop()
        for box in rows:
            if box.parent == parent:
                found.append(box)
                frontier.append(box.session)
    return found


def kill_subtree(session: str, backend: DockerBackend | None = None) -> list[str]:
    """Kill a box and its descendants, whoever owns them; their owners see them die."""
    backend = _engine(backend)
    rows = [_info(c) for c in _containers(backend, engine=False)]
    doomed = subtree(rows, session)
    for box in reversed(doomed):
        log.note("kill", box.session, by=f"quinebox kill (uid {os.getuid()}, pid {os.getpid()})", asked_for=session)
        _kill(box, backend)
    return [box.session for box in doomed]


def print_table(rows: list[BoxInfo]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    for column in ("ID", "COMMAND", "AGE", "STATE", "OWNER"):
        table.add_column(column, overflow="fold")
    for depth, box in as_tree(rows):
        host, _, rest = box.owner.partition(":")
        table.add_row("  " * depth + box.session, box.command, _age(box.age_s), box.state, f"{host}:{rest.partition(':')[0]}")
    Console(width=None if sys.stdout.isatty() else 200).print(table)

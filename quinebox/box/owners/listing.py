"""The boxes of every backend, as `quinebox ps` lists them, and killing a box's subtree.

There is no daemon: each quinebox process owns its boxes, and a box's owner label (`host:pid:start`) is enough
to tell whether that process still lives. Each backend of the registry (backends/registry.py) lists its own boxes
as Box objects (backends/boxes.py): the engine's containers, and each OCI runtime's, whose annotations carry the
same labels. A box is killed
through its own object, whatever its backend.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from quinebox.audit import log
from quinebox.box.backends.boxes import Box, created_at
from quinebox.box.backends.choice import ENGINE
from quinebox.box.backends.registry import BACKENDS, NAMES
from quinebox.box.policy import AGENT_COMMAND, GUEST_PREFIX, LABEL_CREATED, LABEL_OWNER, LABEL_PARENT, LABEL_SESSION, LABEL_USER, NATIVE_INIT
from quinebox.box.pool.claim import claimed_as
from quinebox.box.shape import LABEL_POOL, POOL_SESSION
from quinebox.errors import EngineError, QuineboxError

if TYPE_CHECKING:
    from quinebox.box.backends.docker.engine import DockerBackend

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
    #: The engine's name, or the OCI runtime's the box runs on.
    backend: str = ENGINE
    #: The box itself: what kills it, execs in it and removes it.
    box: Box | None = field(default=None, compare=False, repr=False)


def info(box: Box) -> BoxInfo:
    """A listed box as ps shows it: a warm box once claimed is its claimant's, its command without quinebox's prefix."""
    labels = dict(box.labels)
    command = box.command
    if LABEL_POOL in labels:  # a warm box: once claimed, its record says whose it is now
        record = claimed_as(box.id) or {}
        command = record.get("command", command)
        labels.update({label: record[key] for key, label in _RECORDED.items() if key in record})
    for prefix, shown in ((" ".join(GUEST_PREFIX) + " ", ""), (f"{NATIVE_INIT} -- ", ""), (" ".join(AGENT_COMMAND) + " ", "run: ")):
        if command.startswith(prefix):
            command = shown + command[len(prefix) :]
    return BoxInfo(
        session=labels.get(LABEL_SESSION, "?"), container=box.id, command=command, state=box.state, owner=labels.get(LABEL_OWNER, "?"),
        parent=labels.get(LABEL_PARENT, ""), age_s=max(0.0, time.time() - created_at(labels, box.made)), user=labels.get(LABEL_USER, ""),
        backend=box.backend, box=box,
    )


def every_box(engine: DockerBackend | None, *, connect: bool = True) -> list[Box]:
    """Every quinebox box, on every backend (registry.py): on the engine (`engine`, or one connected to unless
    `connect` is False) and on each OCI runtime used here. A backend that does not answer is an error only when
    nothing else can be listed: a machine may run boxes with no engine."""
    found: list[Box] = []
    failed: EngineError | None = None
    for backend in BACKENDS.values():
        try:
            found += backend.boxes(engine, connect=connect)
        except EngineError as exc:
            failed = exc
    if failed is not None and not found and not (engine is None and _boxes_need_no_engine()):
        raise failed
    return found


def _boxes_need_no_engine() -> bool:
    """Whether this user's boxes run on a backend the engine does not hold (choice.py chooses it): then an engine
    they cannot reach holds none."""
    from quinebox.box.backends import registry
    from quinebox.box.backends.choice import choose

    try:
        return not registry.backend(choose(None, known=NAMES).backend).needs_engine
    except QuineboxError:
        return False


def reachable_engine(engine: DockerBackend | None) -> DockerBackend | None:
    """The engine, if one answers: killing and collecting go on for the runtimes' boxes without it."""
    if engine is not None:
        return engine
    from quinebox.box.backends.docker.engine import DockerBackend

    try:
        return DockerBackend.connect()
    except EngineError:
        return None


def live_boxes(backend: DockerBackend | None = None) -> list[BoxInfo]:
    """Every box that runs something: warm boxes not yet claimed are the pool's, not anyone's command."""
    boxes = (info(box) for box in every_box(backend))
    return sorted((box for box in boxes if not box.session.startswith(POOL_SESSION)), key=lambda b: -b.age_s)


def is_running(session: str, backend: DockerBackend | None = None) -> bool:
    """Whether the box of `session` is still there (its world may still change)."""
    return any(info(box).session == session for box in every_box(backend))


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
    rows = [info(box) for box in every_box(reachable_engine(backend), connect=False)]
    doomed = subtree(rows, session)
    for row in reversed(doomed):
        log.note("kill", row.session, by=f"quinebox kill (uid {os.getuid()}, pid {os.getpid()})", asked_for=session)
        if row.box is not None:
            row.box.kill()
    return [row.session for row in doomed]


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

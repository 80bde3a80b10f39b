"""Long-lived boxes: their records, and where an exec in one runs.

A long-lived box (`quinebox.Sandbox`, `quinebox box create`) is an ordinary box whose main process only waits;
what runs in it runs as execs (execs.py), with the grants it was made with and never more. Its record,
run/sandboxes/<session>.json, names it and says who owns it: the process that made it (a Sandbox's), or a
holder of its own that `box create` leaves running until `box rm`, its TTL or its idle limit. The box ends
with its owner, as every box does; a record whose box is gone is stale, and whoever finds it removes it.

Their files, read and written from inside them, are box_files.py's.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from quinebox.box.backends.boxes import Box
from quinebox.box.backends.registry import backend
from quinebox.box.live.box_files import read_bytes
from quinebox.box.live.capped import Taken as Taken  # re-exported: tests/unit/box/test_taken.py looks for it here
from quinebox.box.live.execs import Target, target_of
from quinebox.box.owners.listing import BoxInfo, live_boxes
from quinebox.box.policy import LABEL_SESSION
from quinebox.errors import ErrorKind, GrantError, QuineboxError
from quinebox.processes import owner_alive, owner_id
from quinebox.state import run_dir

if TYPE_CHECKING:
    from quinebox.box.backends.docker.engine import DockerBackend


@dataclass(frozen=True)
class Record:
    session: str
    container: str
    #: The engine's name, or the OCI runtime's (target reopens the box from it).
    backend: str
    owner: str
    created: float
    name: str | None = None
    #: A holder process of its own (`box create`) owns the box, not the process that asked for it.
    holder: bool = False
    ttl: float | None = None
    idle: float | None = None


def records_dir(*, make: bool = False) -> Path:
    """Where the records are; made only by whoever writes one (a state dir with no long-lived box has none)."""
    path = run_dir() / "sandboxes"
    if make:
        path.mkdir(mode=0o700, exist_ok=True)
    return path


def write_record(record: Record) -> None:
    if record.name is not None:
        taken = next((r for r in records() if r.name == record.name and r.session != record.session), None)
        if taken is not None:
            raise QuineboxError(f"a box named {record.name!r} runs already ({taken.session}): `quinebox box rm {record.name}`, or choose another --name")
    path = records_dir(make=True) / f"{record.session}.json"
    scratch = path.with_suffix(".making")
    scratch.write_text(json.dumps(asdict(record)))
    os.rename(scratch, path)


def remove_record(session: str) -> None:
    """Everything of a box's record gone; two removers at once (an attached box's `destroy` and its owner) are fine."""
    for suffix in (".json", ".used", ".paused", ".ctl"):  # freezing.py's marker, controls.py's socket
        (records_dir() / f"{session}{suffix}").unlink(missing_ok=True)
    execs = records_dir() / f"{session}.execs"
    for marker in execs.glob("*") if execs.is_dir() else ():
        marker.unlink(missing_ok=True)
    with contextlib.suppress(FileNotFoundError):
        execs.rmdir()


def records() -> list[Record]:
    """Every record whose owner still runs; the others are stale and removed here."""
    found = []
    for path in sorted(records_dir().glob("*.json")):
        try:
            record = Record(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue
        if owner_alive(record.owner):
            found.append(record)
        else:
            remove_record(record.session)
    return found


def live(backend: DockerBackend | None = None) -> list[tuple[Record, BoxInfo]]:
    """Each long-lived box that runs, with its record: what `box ls` lists."""
    boxes = {box.session: box for box in live_boxes(backend)}
    return [(record, boxes[record.session]) for record in records() if record.session in boxes]


def find(ref: str, backend: DockerBackend | None = None) -> tuple[Record, BoxInfo]:
    """The live long-lived box named `ref`, or whose id is or starts with it; only its owner's user may reach it."""
    running = live(backend)
    matches = [pair for pair in running if pair[0].name == ref] or [pair for pair in running if pair[0].session.startswith(ref)]
    if len(matches) != 1 or not ref:
        said = "no long-lived box" if not matches else "more than one long-lived box"
        raise QuineboxError(
            f"{said} is named {ref!r} or has an id starting so: `quinebox box ls` lists them",
            kind=ErrorKind.NOT_FOUND if not matches else ErrorKind.BAD_INPUT, ref=ref,
        )
    record, box = matches[0]
    if box.user and box.user != str(os.getuid()):
        raise QuineboxError(f"box {record.session} was made by another user (uid {box.user}): only its owner may reach it", kind=ErrorKind.REFUSED, box=record.session)
    return record, box


def target(record: Record, *, engine: DockerBackend | None = None) -> Target:
    """Where an exec in the recorded box runs: its box, reached from its record (no listing asked); on the
    engine through `engine` when given (the client its box was made with)."""
    return target_of(record.session, _reopen(record, engine))


def _reopen(record: Record, engine: DockerBackend | None) -> Box:
    """The box a record names, by its backend's name and its id; on the engine through `engine`, else this
    process's shared client."""
    return backend(record.backend).reopen(record.backend, record.container, {LABEL_SESSION: record.session}, engine)


def _number(text: str) -> bool:
    """A uid or gid as a user gives one: ASCII digits only (str.isdigit takes '²', which int() then refuses)."""
    return text.isascii() and text.isdigit()


def exec_user(user: str | None, default: str, passwd: bytes | None, *, no_root: str | None = "it has no user namespace of its own") -> str:
    """`uid`, `uid:gid` or a name from the image's /etc/passwd, as `uid:gid`. Root (uid or gid 0) only where
    `no_root` is None: in a box with a user namespace of its own, whose 0 is no one outside (a root-made runc box's
    slot's first id, a rootless box's caller) and holds no capability there; elsewhere refused, `no_root` saying why."""
    if user is None or user == "":
        return default
    name, _, group = user.partition(":")
    if not _number(name):
        entry = next((line.split(b":") for line in (passwd or b"").splitlines() if line.split(b":")[0] == name.encode()), None)
        if entry is None or len(entry) < 4 or not entry[2].isdigit():
            raise GrantError(f"bad user {user!r}: no such user in the box's /etc/passwd; give a uid, as in user='1000'")
        name, group = entry[2].decode(), group or entry[3].decode()
    if not _number(group):
        group = name if not group else ""
    if not group:
        raise GrantError(f"bad user {user!r}: give the group as a number, as in user='1000:1000'")
    if (int(name) == 0 or int(group) == 0) and no_root is not None:
        raise GrantError(
            f"refused user {user!r}: nothing in a box runs as root (uid or gid 0) but in a user namespace of its own that maps it, and this box's root cannot: {no_root}; "
            "give another uid, or run the box on runc"
        )
    return f"{int(name)}:{int(group)}"


def user_of(where: Target, user: str | None) -> str | None:
    """An exec's `uid:gid` for `user` (a uid, uid:gid or a name the box's /etc/passwd knows); None: the box's own.
    Root where the box has a user namespace of its own (runc's boxes, root-made or rootless); never on the Docker
    engine (no user namespace: its root is the host's) nor on gVisor (none either: its gofer, the host's root, makes
    and owns the files the box's root makes, a set-uid one in a rw: grant included)."""
    if not user:
        return None
    passwd = None if _number(user.partition(":")[0]) else read_bytes(where, "/etc/passwd")
    ranges = where.box.id_ranges()
    no_root = None if ranges is not None else where.box.why_not("own_user_namespace")
    resolved = exec_user(user, where.user, passwd, no_root=no_root)
    refused = unmapped(user, resolved, ranges)
    if refused:
        raise GrantError(refused)
    return resolved


def unmapped(user: str, resolved: str, ranges: tuple[list[tuple[int, int]], list[tuple[int, int]]] | None) -> str | None:
    """Why `resolved` (an exec's uid:gid) cannot be `user` in a box whose user namespace maps `ranges` (uids,
    gids: RuntimeBox.id_ranges), or None: a root-made box maps its own 65536 ids (backends/oci/idmap.py), a rootless
    one its user's subordinate range (or its one id)."""
    if ranges is None:
        return None
    for kind, wanted, mapped in zip(("uid", "gid"), (int(i) for i in resolved.split(":")), ranges, strict=True):
        if not any(first <= wanted < first + count for first, count in mapped):
            if sum(count for _, count in mapped) == 1:
                return (f"refused user {user!r}: this rootless box maps its user's own {kind} alone, as the box's 0; give its "
                        "user a range (`sudo usermod --add-subuids 100000-165535 --add-subgids 100000-165535 USER`) for more")
            said = ", ".join(f"{first}" if count == 1 else f"{first}-{first + count - 1}" for first, count in mapped)
            return f"refused user {user!r}: this box's user namespace maps {kind}s {said} only; give one of those"
    return None


# -- activity, for a holder's idle limit ------------------------------------------------------------


def touch(session: str) -> None:
    (records_dir(make=True) / f"{session}.used").touch()


def used(session: str, since: float) -> float:
    """When an exec last began or ended in the box (or `since`, if none has)."""
    try:
        return max(since, (records_dir() / f"{session}.used").stat().st_mtime)
    except OSError:
        return since


class Running:
    """An exec from another process (`exec --in`, `cp`) is running: the box is not idle meanwhile."""

    def __init__(self, session: str):
        self.session = session
        self.marker = records_dir() / f"{session}.execs" / f"{os.getpid()}-{os.urandom(3).hex()}"

    def __enter__(self) -> Running:
        self.marker.parent.mkdir(exist_ok=True)
        self.marker.write_text(owner_id())
        touch(self.session)
        return self

    def __exit__(self, *exc: object) -> None:
        self.marker.unlink(missing_ok=True)
        touch(self.session)


def busy(session: str) -> bool:
    """Does an exec of another live process run in the box? (Its marker names it by owner id: a reused pid is not it.)"""
    execs = records_dir() / f"{session}.execs"
    for marker in execs.glob("*") if execs.is_dir() else ():
        try:
            owner = marker.read_text()
            if owner.count(":") == 2 and owner_alive(owner):  # a bare pid (an older quinebox's marker) is taken as gone
                return True
        except OSError:
            pass
        marker.unlink(missing_ok=True)
    return False


def wait_gone(session: str, within: float, backend: DockerBackend | None = None) -> bool:
    """Has the box stopped running within `within` seconds?"""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(box.session == session for box in live_boxes(backend)):
            return True
        time.sleep(0.1)
    return False


def remove_stale(known: set[str]) -> list[str]:
    """Remove the records of boxes that no longer run (their owner is gone, or `known` lacks them): for `gc`."""
    stale = [record.session for record in records() if record.session not in known and time.time() - record.created > 60]
    for session in stale:
        remove_record(session)
    return stale

"""Claiming a warm box from this user's pool, and the record that says whose box it became.

A request with a shape (box/shape.py) asks the pool on the state dir's
pool.sock; a hit hands over the warm box's three sockets — the listener of
its lifeline, the lifeline connection itself and the stream attached to its
stdio — and from then on this process holds the box exactly as if it had
started it: when this process dies, so does the box. A miss, no pool, or a
pool that does not answer in time is a cold start, never an error.

A container's labels cannot change after it is created, so a claimed box's
session, owner and parent are written to run/claimed/<container>.json, which
`labels` reads over the labels of a warm box.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quinebox import fdpass
from quinebox.box.net.broker import Broker, Channel
from quinebox.box.policy import ContainerConfig
from quinebox.box.shape import shape_of, updates, why_cold
from quinebox.box.spec import BoxSpec
from quinebox.errors import EngineError
from quinebox.state import pool_socket, run_dir

if TYPE_CHECKING:
    from quinebox.box.backends.docker.engine import DockerBackend

#: A pool that takes longer than this to answer is passed over: a cold start is about this slow.
CLAIM_TIMEOUT = 2.0


def pool_wanted() -> bool:
    """Whether to ask a pool at all: QUINEBOX_POOL=off (or QUINEBOX_SERVE=off) starts every box cold."""
    return os.environ.get("QUINEBOX_POOL", "auto") != "off" and os.environ.get("QUINEBOX_SERVE", "auto") != "off"


@dataclass
class WarmBox:
    """A started box waiting on its lifeline: its container, the three sockets a claim hands over, its host paths."""

    container: str
    box: str
    listener: socket.socket
    lifeline: socket.socket
    attach: socket.socket
    socket_path: str
    world: str | None
    #: Whether its image has /bin/sh (an agent's sh tool needs it), seen before it started: the engine cannot
    #: always read a path from a running box (a relative symlink, as busybox's /bin/sh, is a 404 there).
    shell: bool
    #: Whether its init said, when it connected, that it starts execs (the keeper read its hello: net/init_line.py).
    serves_execs: bool = False

    def close_sockets(self) -> None:
        for sock in (self.lifeline, self.listener, self.attach):
            sock.close()


class Claimed(WarmBox):
    """A warm box that is now ours."""

    def settle(self, spec: BoxSpec, command: list[str]) -> None:
        settle(self.container, self.socket_path, self.world, spec, command)

    def start(self, frame: dict[str, Any], broker: Broker | None) -> None:
        """Send the box its claim (it runs the command at once) and serve its lifeline as a cold box's is served."""
        if broker is None or not Channel(self.lifeline).send(frame):
            raise EngineError("the warm box was gone when it was claimed")
        broker.adopt(self.lifeline, init=self.serves_execs)

    def release(self) -> None:
        """Let the box go unused: without its lifeline it kills itself, and the engine removes it."""
        self.close_sockets()


def claim(spec: BoxSpec, config: ContainerConfig, backend: DockerBackend) -> Claimed | None:
    """A warm box for `spec`, its limits set as `config` says, or None when none is to be had (then the caller starts one cold)."""
    if not pool_wanted() or why_cold(spec) is not None:
        return None
    conn = fdpass.connect(str(pool_socket()))  # before the shape is worked out: with no server, that is all a cold box pays
    if conn is None:
        return None
    answer: dict[str, Any] = {}
    fds: list[int] = []
    try:
        shape = shape_of(spec, config)
        if shape is not None:
            fdpass.send(conn, {"kind": "claim", "shape": shape})
            answer, fds = fdpass.receive(conn, CLAIM_TIMEOUT)
    except OSError:
        pass  # a pool that went away meanwhile: a cold start
    finally:
        conn.close()
    if answer.get("kind") != "claimed" or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        return None
    listener, lifeline, attach = (socket.socket(fileno=fd) for fd in fds)
    attach.settimeout(None)
    claimed = Claimed(
        container=str(answer["container"]), box=str(answer["box"]), listener=listener, lifeline=lifeline, attach=attach,
        socket_path=str(answer["lifeline"]), world=answer.get("world"), shell=bool(answer.get("shell")), serves_execs=bool(answer.get("init")),
    )
    limits = updates(config)
    if limits:
        try:
            backend.update(claimed.container, limits)
        except EngineError:
            claimed.release()  # it dies unused; a cold start says what the engine refused, if it still does
            return None
    return claimed


def settle(container: str, socket_path: str, world: str | None, spec: BoxSpec, command: list[str]) -> None:
    """Give a claimed box the session's host paths: its socket and its world move to where a cold box's are, and
    its claim record says whose it became. The box holds both by inode (bind mounts), so it sees no change."""
    os.rename(socket_path, str(spec.lifeline))
    if world is not None and spec.world is not None:
        Path(spec.world.layer).parent.mkdir(parents=True, exist_ok=True)
        os.rename(world, spec.world.layer)
        os.rmdir(os.path.dirname(world))
    record = {"session": spec.session, "owner": spec.owner, "parent": spec.parent or "", "created": spec.created, "command": " ".join(command)}
    path = claim_record(container)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    path.write_text(json.dumps(record))


def claim_record(container: str) -> Path:
    return run_dir() / "claimed" / f"{container}.json"


def claimed_as(container: str) -> dict[str, Any] | None:
    """Whose a claimed warm box became (session, owner, parent, created), or None for any other box."""
    try:
        record = json.loads(claim_record(container).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def forget(container: str) -> None:
    claim_record(container).unlink(missing_ok=True)

"""Warm boxes on the Docker engine: created, attached and started ahead, each waiting on its lifeline for its claim.

The claimer (claim.py) is handed the box's three sockets — the listener of its lifeline, the lifeline itself and
the stream attached to its stdio — and owns the box from then on, exactly as if it had started it: the engine's
events tell it how the box ended, and the engine removes it (AutoRemove).
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from quinebox import fdpass
from quinebox.box.backends.docker.engine import DockerBackend
from quinebox.box.net.broker import box_socket
from quinebox.box.pool.claim import WarmBox
from quinebox.box.pool.warm import holds, let_go, take_lifeline
from quinebox.box.shape import POOL_SESSION, box_user, has_world, warm_config
from quinebox.box.spec import new_session_id
from quinebox.processes import owner_id
from quinebox.state import pool_dir, private_dir, run_dir

#: How long a warm box may take from create to holding its lifeline.
START_TIMEOUT = 30.0


@dataclass
class Warm(WarmBox):
    """A warm box on the engine, since when."""

    since: float = field(default_factory=time.monotonic)

    def alive(self) -> bool:
        return holds(self.lifeline)

    def discard(self) -> None:
        """Let it go unclaimed: without its lifeline it kills itself and the engine removes it."""
        self.close_sockets()
        let_go(self.socket_path, self.world)


    def hand_over(self, conn: socket.socket) -> bool:
        """Its listener, lifeline and attached stream to the claimer (claim.py), who owns the box from now on."""
        try:
            answer = {
                "kind": "claimed", "container": self.container, "box": self.box, "lifeline": self.socket_path, "world": self.world, "shell": self.shell,
                "init": self.serves_execs,
            }
            fdpass.send(conn, answer, [self.listener.fileno(), self.lifeline.fileno(), self.attach.fileno()])
        except OSError:
            self.discard()  # the claimer went away: nobody holds it
            return False
        self.close_sockets()  # the claimer holds its own copies, and the box's paths are the claimer's to move
        return False


def start_warm(backend: DockerBackend, shape: dict[str, Any]) -> Warm:
    """Create and start a box of `shape` and take its lifeline; on any failure nothing is left behind."""
    box = new_session_id()
    path = str(run_dir() / f"{POOL_SESSION}{box}.sock")
    listener = box_socket(path, backlog=16, owner=box_user(shape))
    world = None
    config = container = None
    try:
        if has_world(shape):
            world = str(pool_dir() / box / "tree")
            private_dir(world)  # the user's alone whatever the umask; its box's user owns it below
            if os.getuid() == 0:
                os.chown(world, *box_user(shape))
        created = datetime.now(UTC).isoformat(timespec="seconds")
        config = warm_config(shape, box=box, lifeline=path, world=world, owner=owner_id(), created=created)
        container = backend.create(config)
        shell = backend.exists(container, "/bin/sh")
        attach = backend.attach(container)
        backend.start(container)
        lifeline, serves = take_lifeline(listener, START_TIMEOUT)
        return Warm(box=box, container=container, listener=listener, lifeline=lifeline, attach=attach, socket_path=path, world=world, shell=shell, serves_execs=serves)
    except BaseException:
        if container is not None:
            backend.remove(container)
        elif config is not None:  # the create failed; failed by its deadline, it may yet have made the box, which has this name
            backend.remove(config.create["name"])
        listener.close()
        os.unlink(path)
        if world is not None:
            shutil.rmtree(os.path.dirname(world), ignore_errors=True)
        raise

"""The pool's keeper: the process of its own that `quinebox serve` forks to keep warm boxes (warm.py) and hand them out.

It is forked once commands keep coming (warm.Demand) and tied to the server: however the server goes (`serve
stop`, an idle exit, its state dir removed, SIGKILL) the keeper gets SIGTERM (PR_SET_PDEATHSIG), lets every warm box go — those whose make is under way
included — and waits for the boxes it made on a runtime and handed out to end, before it exits. It answers its
own user's processes as free as itself only (warm.refused), on the state dir's pool.sock: a claim (a shape: a warm box of it, or a miss), or its stats.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
from typing import Any, TypeGuard

from quinebox import fdpass
from quinebox.box.backends.choice import choose
from quinebox.box.backends.docker.engine import DockerBackend
from quinebox.box.backends.oci.warm import wait_claimed
from quinebox.box.backends.registry import NAMES, backend, of_shape
from quinebox.box.policy import oci_refusal
from quinebox.box.pool.warm import Kept, Pool, Settings, refused
from quinebox.box.spec import build_spec
from quinebox.errors import QuineboxError
from quinebox.processes import die_with_parent
from quinebox.state import pool_socket

#: How long a stopping keeper waits for the makes under way: an engine create, its start and the lifeline, each bounded.
SETTLE_TIMEOUT = 90.0


class Stopping(Exception):
    """SIGTERM reached the keeper (`serve stop`, or its server died): raised in its main thread, out of `accept`."""


class Makers:
    """What makes a warm box of each backend: a runtime's at once; the engine's once it answers (it is connected
    to when a shape of it is first wanted; until then each make fails, and the pool waits and tries again)."""

    def __init__(self) -> None:
        self._engine: DockerBackend | None = None
        self._lock = threading.Lock()

    def make(self, shape: dict[str, Any]) -> Kept:
        made = of_shape(shape)
        if made is None:
            raise QuineboxError("a shape of no backend of this quinebox's")
        return made.make_warm(shape, self.engine)

    @staticmethod
    def image_of(shape: dict[str, Any]) -> str:
        made = of_shape(shape)
        return made.image_of(shape) if made is not None else "?"

    def engine(self) -> DockerBackend:
        with self._lock:
            if self._engine is None:
                self._engine = DockerBackend.connect()
            return self._engine


def default_shape(makers: Makers) -> dict[str, Any] | None:
    """The shape of `quinebox exec -- CMD` and `quinebox run MISSION` with no options (one shape: both are the
    same box), on the backend such a command would choose here."""
    spec = build_spec(["true"])
    choice = choose(oci_refusal(spec), known=NAMES, backend=spec.backend, runtime=spec.runtime, spec=spec)
    return backend(choice.backend).default_shape(spec, choice, makers.engine)


def _well_formed(shape: Any) -> TypeGuard[dict[str, Any]]:
    """Whether a claimer's shape has the form of its backend's shapes (the pool makes boxes of it only if so)."""
    made = of_shape(shape)
    return made is not None and made.well_formed(shape)


def keep(settings: Settings, parent: int) -> None:
    """The keeper's life, in a process forked for it: serve claims on pool.sock until the server goes.

    However the server goes (`serve stop`, an idle exit, SIGKILL), the keeper gets SIGTERM and lets every box go,
    those whose create or start is under way included, before it exits."""

    def stop(*_: object) -> None:
        raise Stopping

    signal.signal(signal.SIGTERM, stop)
    die_with_parent(parent, signal.SIGTERM)
    try:
        _keep(settings)
    except Stopping:
        pass
    os._exit(0)


def _keep(settings: Settings) -> None:
    makers = Makers()
    pool = Pool(settings, makers.make, makers.image_of)
    bound: tuple[socket.socket, os.stat_result] | None = None  # pool.sock, and the file it is, once listening
    try:
        listener = fdpass.listen(str(pool_socket()), mode=0o600, backlog=64)
        bound = listener, os.stat(pool_socket())
        if settings.size:
            try:
                shape = default_shape(makers)
                if shape is not None:
                    pool.want(shape)
            except QuineboxError as exc:
                print(f"quinebox pool: no default shape: {exc}", file=sys.stderr, flush=True)
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=_answer, args=(pool, conn), daemon=True).start()
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once stopping, stopping again would cut the wait short
        if bound is not None:
            unlink_own(*bound)
        pool.close()
        if not pool.settle(SETTLE_TIMEOUT):
            print("quinebox pool: a warm box's create or start did not end in time; `quinebox gc` removes what it left", file=sys.stderr, flush=True)
        wait_claimed()  # a runtime's claimed boxes are this process's children: they run to their end, then go


def unlink_own(listener: socket.socket, bound: os.stat_result) -> None:
    """Close `listener` and remove its path, unless the path is no longer the file it bound (`bound`: the next
    server's keeper, started while this one settles, has bound its own there)."""
    path = listener.getsockname()
    try:
        now = os.stat(path)
        if (now.st_dev, now.st_ino) == (bound.st_dev, bound.st_ino):
            os.unlink(path)
    except FileNotFoundError:
        pass
    listener.close()


def _answer(pool: Pool, conn: socket.socket) -> None:
    kept = False  # a runtime's claimed box keeps the connection: how the box ended is told on it
    try:
        if refused(conn):  # another user's, or a process less free than the pool (a sandboxed one's)
            return
        message, fds = fdpass.receive(conn, 2.0)
        for fd in fds:
            os.close(fd)
        if message.get("kind") == "stats":
            fdpass.send(conn, {"kind": "stats", "pid": os.getpid(), "settings": pool.settings.__dict__, "shapes": pool.stats()})
            return
        shape = message.get("shape")
        box = pool.claim(shape) if message.get("kind") == "claim" and _well_formed(shape) and pool.settings.size else None
        if box is None:
            fdpass.send(conn, {"kind": "miss"})
            return
        kept = box.hand_over(conn)
    except OSError:
        return  # the claimer went away
    finally:
        if not kept:
            conn.close()

"""Warm boxes on an OCI runtime (runc, runsc): started ahead by the pool's keeper, each init waiting for its claim.

A warm box is made as a cold one is (oci/box.py: its own root over the image, `runtime run --detach`, the keeper a
subreaper while it starts), from its shape's config.json with a lifeline socket, world and cgroup of its own,
running the guest's init in pool mode. The claimer (oci/claim.py) is handed the lifeline's listener, the lifeline
itself and a pidfd of the box's init, and sends the init its command with the claimer's own stdin, stdout and
stderr (SCM_RIGHTS): the box then reads and writes them itself, and no byte passes through the keeper or the
claimer.

The keeper made the box, so the init is its child: it waits for it, reads an OOM kill from the box's cgroup
before the runtime deletes it, and tells the claimer how the box ended on the connection the claim came in on;
then it removes the box, off the claimer's path. A keeper that stops lets its warm boxes go at once and waits
for the claimed ones to end (each ends with its claimer at the latest); one killed outright leaves them to the
boxes' keeper it shares with its server (backends/keeper.py), which removes them.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from datetime import UTC, datetime
from typing import Any

from quinebox import fdpass
from quinebox.box.backends.docker.warm import START_TIMEOUT
from quinebox.box.backends.oci import idmap
from quinebox.box.backends.oci.box import OciBox, finish_removals, oci_runtime
from quinebox.box.net.broker import box_socket
from quinebox.box.pool.claim import forget
from quinebox.box.pool.warm import holds, let_go, take_lifeline
from quinebox.box.shape import POOL_SESSION, oci_box_user, oci_has_world, own_ids, warm_oci_config
from quinebox.box.spec import new_session_id
from quinebox.errors import EngineError
from quinebox.processes import owner_id
from quinebox.state import pool_dir, private_dir, run_dir

#: The boxes this process made and handed over, until each has ended: a stopping keeper waits for them.
_claimed: set[WarmOci] = set()
_claimed_lock = threading.Condition()


class WarmOci:
    """A warm box on an OCI runtime, made at once: its init holds its lifeline when this returns."""

    def __init__(self, shape: dict[str, Any]):
        self.box = new_session_id()
        self.since = time.monotonic()
        self.socket_path = str(run_dir() / f"{POOL_SESSION}{self.box}.sock")
        self.world: str | None = None
        self._lock = threading.Lock()
        self._claimer: socket.socket | None = None
        self._ended = threading.Event()
        self._oci: OciBox | None = None
        self._pidfd: int | None = None
        #: Its own host ids (a root-made box's, idmap.py), and so the host's ids of its user, who owns its world and socket.
        self.ids = idmap.claim(POOL_SESSION + self.box) if own_ids(shape) else None
        uid, gid = oci_box_user(shape)
        self.owner = (self.ids.host(uid), self.ids.host(gid)) if self.ids is not None else (uid, gid)
        try:
            self.listener = box_socket(self.socket_path, backlog=16, owner=self.owner)
        except BaseException:
            if self.ids is not None:
                idmap.release(self.ids, POOL_SESSION + self.box)
            raise
        self.lifeline: socket.socket | None = None
        #: Whether its init said it starts execs (its hello, read as it connected: pool/warm.py's take_lifeline).
        self.serves_execs = False
        try:
            if oci_has_world(shape):
                self.world = str(pool_dir() / self.box / "tree")
                private_dir(self.world)  # the user's alone whatever the umask; its box's user owns it below
                if os.getuid() == 0:
                    os.chown(self.world, *self.owner)
            created = datetime.now(UTC).isoformat(timespec="seconds")
            config = warm_oci_config(
                shape, box=self.box, lifeline=self.socket_path, world=self.world, owner=owner_id(), created=created,
                userns=(self.ids.first, self.ids.span) if self.ids is not None else None,
            )
            null = os.open(os.devnull, os.O_RDWR)  # the init's stdio until its claim brings the claimer's
            try:
                self._oci = OciBox(oci_runtime(shape["runtime"]), POOL_SESSION + self.box, config, stdio=(null, null, null), ended=self._end)
            finally:
                os.close(null)
            self._pidfd = self._oci.pidfd()
            if self._pidfd is None:
                raise EngineError("the warm box's init exited as it started")
            self.lifeline, self.serves_execs = take_lifeline(self.listener, START_TIMEOUT)
        except BaseException:
            self.discard()
            raise

    @property
    def container(self) -> str:
        assert self._oci is not None
        return self._oci.id

    def alive(self) -> bool:
        """Its init has not exited (its pidfd says so at once) and holds its lifeline."""
        if self.lifeline is None or self._pidfd is None or self._ended.is_set():
            return False
        exited, _, _ = select.select([self._pidfd], [], [], 0)
        return not exited and holds(self.lifeline)

    def hand_over(self, conn: socket.socket) -> bool:
        """The lifeline's listener, the lifeline and the init's pidfd to the claimer; how the box ends is told on `conn`."""
        assert self.lifeline is not None and self._pidfd is not None
        with self._lock:  # `_end` sets `_ended` under it: a box is claimed before its end, or not at all
            if self._ended.is_set():
                return False
            self._claimer = conn
            with _claimed_lock:  # before it is the claimer's: a keeper stopping meanwhile waits for it to end
                _claimed.add(self)
        answer = {
            "kind": "claimed", "container": self.container, "box": self.box, "lifeline": self.socket_path, "world": self.world, "init": self.serves_execs,
            "owner": list(self.owner),
        }
        try:
            fdpass.send(conn, answer, [self.listener.fileno(), self.lifeline.fileno(), self._pidfd])
        except OSError:
            with self._lock:
                self._claimer = None
            self.discard()  # the claimer went away: nobody holds it, and it ends (`_end`) as a warm box that died
            return False
        self._close_ours()  # the claimer holds its own copies, and the box's paths are the claimer's to move
        return True

    def discard(self) -> None:
        """Let it go unclaimed: without its lifeline its init kills everything and exits, and `_end` follows."""
        self._close_ours()
        let_go(self.socket_path, self.world)
        if self._oci is not None and self.lifeline is None:
            self._oci.kill()  # it never held its lifeline: nothing else would end it
        if self._oci is None and self.ids is not None:  # a box made gives its ids back with its remains
            idmap.release(self.ids, POOL_SESSION + self.box)

    def _close_ours(self) -> None:
        for sock in (self.listener, self.lifeline):
            if sock is not None:
                sock.close()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def _end(self, code: int, oom: bool, died: str | None) -> None:
        """The init has exited (OciBox's wait, before it removes the box): the claimer, if any, is told how."""
        with self._lock:
            self._ended.set()
            claimer, self._claimer = self._claimer, None
        if claimer is not None:
            try:
                fdpass.send(claimer, {"kind": "ended", "code": code, "oom": oom, "died": died})
            except OSError:
                pass  # the claimer is gone: its box went with it
            claimer.close()
            forget(self.container)  # whose it became ends with it, whether its claimer lived to say so or not
        with _claimed_lock:
            _claimed.discard(self)
            _claimed_lock.notify_all()


def wait_claimed() -> None:
    """Until every box this process handed over has ended and been removed (a stopping keeper's last wait)."""
    with _claimed_lock:
        _claimed_lock.wait_for(lambda: not _claimed)
    finish_removals()

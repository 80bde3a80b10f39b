"""Claiming a warm box on an OCI runtime from this user's pool (oci/warm.py): the claimer's side.

A request whose shape (shape.oci_shape_of) the pool keeps warm gets the box's lifeline listener, the lifeline
itself and a pidfd of its init, and keeps its connection to the pool's keeper, on which the keeper — the init's
parent — says how the box ended. The claimer sends the init its command with its own stdin, stdout and stderr
(SCM_RIGHTS), and serves the lifeline as a cold box's. Killing the box is a signal to its init's pidfd: the kernel
then empties the box's pid namespace. The keeper removes the box once it has ended. A miss, no pool, or a pool
that does not answer in time is a cold start, never an error.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from quinebox import fdpass
from quinebox.box.backends.oci.boxroot import bundle_of
from quinebox.box.backends.oci.runtime import made_as
from quinebox.box.net.broker import Broker, Channel
from quinebox.box.pool.claim import CLAIM_TIMEOUT, pool_wanted, settle
from quinebox.box.shape import oci_shape_of, why_cold
from quinebox.box.spec import BoxSpec
from quinebox.errors import EngineError
from quinebox.state import pool_socket

#: (exit status, OOM-killed, why the sandbox itself died, if it did): as backends/oci/box.py's Ended.
Ended = Callable[[int, bool, "str | None"], None]
#: How a box ends whose keeper went away while it ran (the boxes' keeper kills and removes what it made).
KEEPER_GONE = "the pool's keeper went away while the box ran (`quinebox serve status`)"
EXIT_KILLED = 137


@dataclass
class ClaimedOci:
    """A warm box on a runtime that is now this process's: its sockets, its init's pidfd, the keeper's connection."""

    container: str
    box: str
    listener: socket.socket
    lifeline: socket.socket
    pidfd: int
    socket_path: str
    world: str | None
    keeper: socket.socket
    #: The host's (uid, gid) of its user: its world and socket are theirs (a root-made box's own ids, idmap.py).
    owner: tuple[int, int]
    #: Whether its init said, as it connected, that it starts execs (net/init_line.py).
    serves_execs: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _released: bool = False
    _following: bool = False

    def settle(self, spec: BoxSpec, process: dict[str, Any]) -> None:
        """The session's host paths and claim record (claim.settle), and the box's bundle saying the process a cold
        box's would: a runtime's `exec` into it (another user, a terminal) starts from that process's environment."""
        settle(self.container, self.socket_path, self.world, spec, process["args"])
        config_path = bundle_of(made_as(self.container)) / "config.json"
        config = json.loads(config_path.read_text())
        config["process"] = {**config["process"], "args": process["args"], "env": process["env"]}
        scratch = config_path.with_suffix(".claimed")
        scratch.write_text(json.dumps(config, separators=(",", ":")))
        os.rename(scratch, config_path)

    def start(self, frame: dict[str, Any], stdio: tuple[int, int, int], broker: Broker | None, ended: Ended) -> None:
        """Hear from the keeper how the box ends; send the init its claim with `stdio` (it runs the command at once);
        serve its lifeline as a cold box's is served."""
        self._following = True
        threading.Thread(target=self._follow, args=(ended,), name=f"claimed:{self.container}", daemon=True).start()
        if broker is None or not Channel(self.lifeline).send(frame, fds=stdio):
            raise EngineError("the warm box was gone when it was claimed")
        broker.adopt(self.lifeline, init=self.serves_execs)

    def _follow(self, ended: Ended) -> None:
        try:
            answer, fds = fdpass.receive(self.keeper, None)
        except OSError:
            answer, fds = {}, []
        for fd in fds:
            os.close(fd)
        self.keeper.close()
        self._close_pidfd()
        if self._released:
            return  # its start failed: nobody waits for its end
        if answer.get("kind") != "ended":
            ended(EXIT_KILLED, False, KEEPER_GONE)
            return
        code = answer.get("code")
        died = answer.get("died")
        ended(code if isinstance(code, int) else EXIT_KILLED, bool(answer.get("oom")), died if isinstance(died, str) else None)

    def kill(self) -> None:
        """SIGKILL the box's init (the kernel kills the rest of its pid namespace); a box that has ended is left be."""
        self.signal(signal.SIGKILL)

    def signal(self, signum: int) -> None:
        """`signum` to the box's init; a box that has ended is left be."""
        with self._lock:
            if self.pidfd >= 0:
                try:
                    signal.pidfd_send_signal(self.pidfd, signum)
                except OSError:
                    pass

    def _close_pidfd(self) -> None:
        with self._lock:
            if self.pidfd >= 0:
                os.close(self.pidfd)
                self.pidfd = -1

    def release(self) -> None:
        """Let the box go unused (a start that failed after the claim): without its lifeline it kills itself."""
        self._released = True
        try:
            self.keeper.shutdown(socket.SHUT_RDWR)  # its follower, if any, wakes and leaves; the keeper hears we left
        except OSError:
            pass
        for sock in (self.lifeline, self.listener):
            sock.close()
        if not self._following:  # else its follower lets go of them as it leaves
            self.keeper.close()
            self._close_pidfd()


def claim_oci(spec: BoxSpec, config: dict[str, Any], runtime: str) -> ClaimedOci | None:
    """A warm box on `runtime` for `spec` (its config.json `config`), or None when none is to be had (then the
    caller starts one cold)."""
    if not pool_wanted() or why_cold(spec) is not None:
        return None
    conn = fdpass.connect(str(pool_socket()))  # before the shape is worked out: with no server, that is all a cold box pays
    if conn is None:
        return None
    answer: dict[str, Any] = {}
    fds: list[int] = []
    try:
        shape = oci_shape_of(spec, config, runtime)
        if shape is not None:
            fdpass.send(conn, {"kind": "claim", "shape": shape})
            answer, fds = fdpass.receive(conn, CLAIM_TIMEOUT)
    except OSError:
        pass  # a pool that went away meanwhile: a cold start
    if answer.get("kind") != "claimed" or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        conn.close()
        return None
    owner = answer.get("owner")
    if not (isinstance(owner, list) and len(owner) == 2 and all(isinstance(i, int) for i in owner)):
        for fd in fds:
            os.close(fd)
        conn.close()
        return None
    listener, lifeline = (socket.socket(fileno=fd) for fd in fds[:2])
    return ClaimedOci(
        container=str(answer["container"]), box=str(answer["box"]), listener=listener, lifeline=lifeline, pidfd=fds[2],
        socket_path=str(answer["lifeline"]), world=answer.get("world"), keeper=conn, owner=(owner[0], owner[1]), serves_execs=bool(answer.get("init")),
    )

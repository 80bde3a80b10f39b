"""The warm pool: boxes created and started ahead of demand, per shape, each waiting for its one command.

`quinebox serve` runs the pool in a process of its own (keeper.py), forked
once commands keep coming (`Demand`: never for a short job) and tied to it: when the server dies the
keeper lets every warm box go (their lifelines). A warm box runs only the guest's
init (`shape.POOL_COMMAND`): it holds no session, no grants beyond its shape, no
mounts beyond its own empty world, and no command, environment or secret
reaches it before it is claimed (claim.py, oci/claim.py). Whoever claims it gets
its sockets and it runs the claimer's command; the pool forgets it, and makes
another. Each backend makes its own (docker/warm.py on the engine, oci/warm.py
on an OCI runtime); this is what they share.

Shapes are learned from demand (each miss registers its shape), beside the
default box's, which is known from the start. Refill runs in the background,
at most `creates` makes at a time, so that it never takes the engine or the
machine from running work; a shape nobody claimed for `ttl` seconds is
dropped with its warm boxes.
"""

from __future__ import annotations

import io
import os
import select
import shutil
import socket
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from quinebox import fdpass
from quinebox.box.shape import shape_key
from quinebox.errors import QuineboxError
from quinebox.guest import protocol

#: The most a hello may hold (it is a few dozen bytes).
MAX_HELLO = 4096
#: How long a refill waits after a claim: the claimed box's command, and its claimer, have the machine first.
REFILL_AFTER = 0.03
#: After a failed make, a shape waits this long before the pool tries again.
BACKOFF = 5.0
#: The most shapes kept at once; one more pushes out the one claimed least recently.
MAX_SHAPES = 8


class Kept(Protocol):
    """A warm box the pool keeps, of either backend."""

    def alive(self) -> bool:
        """Whether its init still holds the lifeline (a box that died waiting has closed it)."""

    def discard(self) -> None:
        """Let it go unclaimed: without its lifeline it kills itself, and whoever made it removes it."""

    def hand_over(self, conn: socket.socket) -> bool:
        """Give the claimer on `conn` the box's sockets; True when `conn` is the box's from now on (the keeper tells
        the claimer there how the box ended), False when the keeper may close it."""


#: Makes a warm box of a shape (the keeper's, by the shape's backend).
Maker = Callable[[dict[str, Any]], Kept]
#: How long a warm box's init may take, once connected, to say it serves execs (an init of an older quinebox
#: says nothing: its box is warm all the same, and its execs take the runtime's way).
HELLO_TIMEOUT = 2.0


def take_lifeline(listener: socket.socket, timeout: float) -> tuple[socket.socket, bool]:
    """A warm box's lifeline, once its init connects (within `timeout` seconds), and whether its init serves execs:
    its hello is read here, so that nothing but the end of the connection is left to read before the claim (which
    is how `holds` tells a live box from a dead one), and the claimer is told what it said."""
    listener.settimeout(timeout)
    lifeline, _ = listener.accept()
    listener.settimeout(None)
    lifeline.settimeout(HELLO_TIMEOUT)
    try:
        hello = _exactly(lifeline, protocol.HEADER.size)
        size, payload = protocol.HEADER.unpack(hello)
        said = protocol.read_frame(io.BytesIO(hello + _exactly(lifeline, size + payload)))[0] if size + payload <= MAX_HELLO else {}
    except (TimeoutError, EOFError, protocol.ProtocolError):
        said = {}
    finally:
        lifeline.settimeout(None)
    return lifeline, said.get("kind") == "hello" and "exec" in (said.get("serves") or ())


def _exactly(sock: socket.socket, size: int) -> bytes:
    data = sock.recv(size, socket.MSG_WAITALL) if size else b""
    if len(data) < size:
        raise EOFError
    return data


def holds(lifeline: socket.socket) -> bool:
    """Whether a warm box's init still holds its end of `lifeline` (one that died waiting has closed it: nothing
    else is left to read on it before its claim)."""
    readable, _, _ = select.select([lifeline], [], [], 0)
    if not readable:
        return True
    try:
        return lifeline.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def let_go(socket_path: str, world: str | None) -> None:
    """What a warm box let go unclaimed leaves on the host, removed, on every backend: its socket and its empty world."""
    try:
        os.unlink(socket_path)
    except FileNotFoundError:
        pass
    if world is not None:
        shutil.rmtree(os.path.dirname(world), ignore_errors=True)


def refused(conn: socket.socket) -> bool:
    """Whether the pool serves no claim from the process on `conn`: another user's (not answered at all), or one of
    this user's less free than the pool (fdpass.unfree: a sandboxed agent's), which is told why in one line. A warm
    box handed to it would be a box started with the pool's freedom (its network, its engine, its runtime); refused,
    the claimer starts its box cold, itself, under its own confinement (claim.py takes any answer but a box as a miss)."""
    unfree = fdpass.unfree(conn)
    if unfree is None:
        return False
    if fdpass.peer_uid(conn) == os.geteuid():
        try:
            _, fds = fdpass.receive(conn, 2.0)  # its request first: closed unread, it could be cut off before it reads the answer
            for fd in fds:
                os.close(fd)
            fdpass.send(conn, {"kind": "refused", "error": f"the warm pool serves no process less free than itself ({unfree}): start the box cold"})
        except OSError:
            pass
    return True


@dataclass(frozen=True)
class Settings:
    """`pool:` in config.yaml — a size, or {size, ttl, creates, after} — and `quinebox serve --pool N`.

    `after`: the pool starts at the server's `after`th command within START_WINDOW (0: with the server). A size
    given on the command line (`serve --pool N`) is a pool asked for now: it starts with the server."""

    size: int = 4
    ttl: float = 600.0
    creates: int = 2
    after: int = 3

    @classmethod
    def from_config(cls, config: Any, size: int | None = None) -> Settings:
        fields = {"size": config} if isinstance(config, int) else dict(config) if isinstance(config, dict) else {}
        if config is not None and not fields or set(fields) - {"size", "ttl", "creates", "after"}:
            raise QuineboxError("bad `pool:` in config.yaml: give a size (pool: 4) or a mapping of size, ttl (seconds), creates and after (commands)")
        try:
            settings = cls(size=int(fields.get("size", cls.size)), ttl=float(fields.get("ttl", cls.ttl)), creates=int(fields.get("creates", cls.creates)),
                           after=int(fields.get("after", cls.after)))
        except (TypeError, ValueError):
            raise QuineboxError("bad `pool:` in config.yaml: size, creates and after are whole numbers, ttl is seconds") from None
        if size is not None:
            settings = replace(settings, size=size, after=0)
        if settings.size < 0 or settings.ttl <= 0 or settings.creates < 1 or settings.after < 0:
            raise QuineboxError("bad pool settings: size ≥ 0, ttl > 0, creates ≥ 1 and after ≥ 0")
        return settings


#: The window in which a server counts commands towards starting its pool (Settings.after).
START_WINDOW = 60.0


class Demand:
    """When a command server starts its pool: once commands keep coming, not on a state dir's first. A pool's boxes
    outlive the commands that wanted them by its ttl, so a short job (a CI step, a test suite's state dir of its own,
    a person's odd command) that started one would leave warm boxes, and the server holding them, running long
    after it ended; from the `after`th command within START_WINDOW seconds on, a pool pays for itself."""

    def __init__(self, after: int):
        self.after = after
        self._times: deque[float] = deque()

    def command(self) -> bool:
        """One more command came, now; whether the pool is due."""
        now = time.monotonic()
        self._times.append(now)
        while now - self._times[0] > START_WINDOW:
            self._times.popleft()
        return len(self._times) >= self.after


class Kind:
    """The warm boxes of one shape, and how claims for it went."""

    def __init__(self, shape: dict[str, Any], image: str):
        self.shape = shape
        self.key = shape_key(shape)
        #: The short id of its image, as `serve status` shows it (its backend's to say: Pool's `image_of`).
        self.image = image
        self.warm: deque[Kept] = deque()
        self.making = 0
        self.hits = self.misses = 0
        self.latencies: deque[float] = deque(maxlen=10_000)
        self.used = time.monotonic()
        self.failed = 0.0

    def stats(self) -> dict[str, Any]:
        ms = sorted(self.latencies)
        cuts = statistics.quantiles(ms, n=100, method="inclusive") if len(ms) > 1 else ms * 99
        return {
            "shape": self.key, "image": self.image, "warm": len(self.warm), "making": self.making,
            "hits": self.hits, "misses": self.misses, "p50_ms": cuts[49] if cuts else None, "p95_ms": cuts[94] if cuts else None,
            "p99_ms": cuts[98] if cuts else None,
        }


class Pool:
    def __init__(self, settings: Settings, make: Maker, image_of: Callable[[dict[str, Any]], str]):
        self.settings = settings
        self._make_box = make
        self._image_of = image_of
        self._kinds: dict[str, Kind] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._creating = threading.Semaphore(settings.creates)
        self._closed = False
        #: Makes under way, of every kind (a dropped kind's too): `settle` waits for them.
        self._making = 0
        self._settled = threading.Condition(self._lock)
        threading.Thread(target=self._refill, name="pool-refill", daemon=True).start()

    def want(self, shape: dict[str, Any]) -> Kind:
        """The kind of `shape`, registered if new (pushing out the least recently claimed past MAX_SHAPES)."""
        key = shape_key(shape)
        with self._lock:
            kind = self._kinds.get(key)
            if kind is None:
                kind = self._kinds[key] = Kind(shape, self._image_of(shape))
                if len(self._kinds) > MAX_SHAPES:
                    oldest = min(self._kinds.values(), key=lambda k: k.used)
                    self._drop(oldest)
        self._wake.set()
        return kind

    def claim(self, shape: dict[str, Any]) -> Kept | None:
        """A warm box of `shape`, now the caller's; None (a miss, and the shape is wanted from now on) when none is warm."""
        began = time.perf_counter()
        kind = self.want(shape)
        dead = []
        with self._lock:
            kind.used = time.monotonic()
            found = None
            while kind.warm and found is None:
                box = kind.warm.popleft()
                if box.alive():
                    found = box
                else:
                    dead.append(box)
            if found is None:
                kind.misses += 1
            else:
                kind.hits += 1
                kind.latencies.append((time.perf_counter() - began) * 1000)
        for box in dead:
            box.discard()
        self._wake.set()
        return found

    def stats(self) -> list[dict[str, Any]]:
        with self._lock:
            return [kind.stats() for kind in self._kinds.values()]

    def close(self) -> None:
        """Make no more and let every warm box go; a make under way discards its box when it ends (`settle`)."""
        with self._lock:
            self._closed = True
            for kind in list(self._kinds.values()):
                self._drop(kind)

    def settle(self, timeout: float) -> bool:
        """After `close`: wait until every make under way has ended and let its box go; whether they all did in time.
        An engine create the keeper stopped waiting for would otherwise make a box nobody holds or removes."""
        with self._settled:
            return self._settled.wait_for(lambda: self._making == 0, timeout)

    def _drop(self, kind: Kind) -> None:
        """Under the lock: forget `kind` and let its warm boxes go."""
        self._kinds.pop(kind.key, None)
        while kind.warm:
            kind.warm.popleft().discard()

    def _refill(self) -> None:
        while not self._closed:
            if self._wake.wait(1.0):
                time.sleep(REFILL_AFTER)  # the box just claimed runs its command first: a make takes a core meanwhile
            self._wake.clear()
            now = time.monotonic()
            with self._lock:
                for kind in list(self._kinds.values()):
                    if now - kind.used > self.settings.ttl:
                        self._drop(kind)
                wanted = [k for k in self._kinds.values() if len(k.warm) + k.making < self.settings.size and now - k.failed > BACKOFF]
                for kind in sorted(wanted, key=lambda k: len(k.warm) + k.making):
                    if not self._creating.acquire(blocking=False):
                        break
                    kind.making += 1
                    self._making += 1
                    threading.Thread(target=self._make, args=(kind,), name="pool-make", daemon=True).start()

    def _make(self, kind: Kind) -> None:
        box = None
        try:
            box = self._make_box(kind.shape)
        except (QuineboxError, OSError) as exc:  # the engine or runtime refused or did not answer: say so, wait, and try again (a bug propagates)
            print(f"quinebox pool: cannot make a warm box of shape {kind.key}: {exc}", file=sys.stderr, flush=True)
            kind.failed = time.monotonic()
        finally:
            self._creating.release()
            with self._lock:
                kind.making -= 1
                if box is not None and not self._closed and self._kinds.get(kind.key) is kind:
                    kind.warm.append(box)
                    box = None
            if box is not None:
                box.discard()
            with self._lock:
                self._making -= 1
                self._settled.notify_all()
            self._wake.set()



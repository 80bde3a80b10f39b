"""The warm pool: boxes created and started ahead of demand, per shape, each waiting for its one command.

`quinebox serve` runs the pool in a process of its own (`keep`), forked
before the server answers anyone and tied to it: when the server dies the
keeper dies (PR_SET_PDEATHSIG), and every warm box with it (their
lifelines). A warm box runs only the guest's init (`shape.POOL_COMMAND`): it
holds no session, no grants beyond its shape, no mounts beyond its own empty
world, and no command, environment or secret reaches it before it is claimed
(box/pool/claim.py). Whoever claims it gets its sockets and owns it from then on;
the pool forgets it, and makes another.

Shapes are learned from demand (each miss registers its shape), beside the
default box's, which is known from the start. Refill runs in the background,
at most `creates` engine creates at a time, so that it never takes the
engine from running work; a shape nobody claimed for `ttl` seconds is
dropped with its warm boxes.
"""

from __future__ import annotations

import ctypes
import os
import select
import shutil
import signal
import socket
import statistics
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from quinebox import fdpass
from quinebox.box.backends.docker import DockerBackend
from quinebox.box.configure import configure
from quinebox.box.net.broker import box_socket
from quinebox.box.pool.claim import WarmBox
from quinebox.box.shape import POOL_SESSION, box_user, has_world, shape_key, shape_of, warm_config, well_formed
from quinebox.box.spec import build_spec, new_session_id
from quinebox.errors import EngineError, QuineboxError
from quinebox.processes import owner_id
from quinebox.state import pool_dir, pool_socket, run_dir

#: How long a warm box may take from create to holding its lifeline.
START_TIMEOUT = 30.0
#: After a failed create, a shape waits this long before the pool tries again.
BACKOFF = 5.0
#: The most shapes kept at once; one more pushes out the one claimed least recently.
MAX_SHAPES = 8
PR_SET_PDEATHSIG = 1
#: How long a stopping keeper waits for the makes under way: an engine create, its start and the lifeline, each bounded.
SETTLE_TIMEOUT = 90.0


@dataclass(frozen=True)
class Settings:
    """`pool:` in config.yaml — a size, or {size, ttl, creates} — and `quinebox serve --pool N`."""

    size: int = 4
    ttl: float = 600.0
    creates: int = 2

    @classmethod
    def from_config(cls, config: Any, size: int | None = None) -> Settings:
        fields = {"size": config} if isinstance(config, int) else dict(config) if isinstance(config, dict) else {}
        if config is not None and not fields or set(fields) - {"size", "ttl", "creates"}:
            raise QuineboxError("bad `pool:` in config.yaml: give a size (pool: 4) or a mapping of size, ttl (seconds) and creates")
        try:
            settings = cls(size=int(fields.get("size", cls.size)), ttl=float(fields.get("ttl", cls.ttl)), creates=int(fields.get("creates", cls.creates)))
        except (TypeError, ValueError):
            raise QuineboxError("bad `pool:` in config.yaml: size and creates are whole numbers, ttl is seconds") from None
        if size is not None:
            settings = replace(settings, size=size)
        if settings.size < 0 or settings.ttl <= 0 or settings.creates < 1:
            raise QuineboxError("bad pool settings: size ≥ 0, ttl > 0 and creates ≥ 1")
        return settings


@dataclass
class Warm(WarmBox):
    """A warm box in the pool, since when."""

    since: float = field(default_factory=time.monotonic)

    def alive(self) -> bool:
        """Whether its init still holds the lifeline (a box that died waiting has closed it)."""
        readable, _, _ = select.select([self.lifeline], [], [], 0)
        if not readable:
            return True
        try:
            return self.lifeline.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
        except BlockingIOError:
            return True
        except OSError:
            return False

    def discard(self) -> None:
        """Let it go unclaimed: without its lifeline it kills itself and the engine removes it."""
        self.close_sockets()
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass
        if self.world is not None:
            shutil.rmtree(os.path.dirname(self.world), ignore_errors=True)


class Kind:
    """The warm boxes of one shape, and how claims for it went."""

    def __init__(self, shape: dict[str, Any]):
        self.shape = shape
        self.key = shape_key(shape)
        self.warm: deque[Warm] = deque()
        self.making = 0
        self.hits = self.misses = 0
        self.latencies: deque[float] = deque(maxlen=10_000)
        self.used = time.monotonic()
        self.failed = 0.0

    def stats(self) -> dict[str, Any]:
        ms = sorted(self.latencies)
        cuts = statistics.quantiles(ms, n=100, method="inclusive") if len(ms) > 1 else ms * 99
        return {
            "shape": self.key, "image": str(self.shape["create"]["image"]).split(":")[-1][:12], "warm": len(self.warm), "making": self.making,
            "hits": self.hits, "misses": self.misses, "p50_ms": cuts[49] if cuts else None, "p95_ms": cuts[94] if cuts else None,
            "p99_ms": cuts[98] if cuts else None,
        }


class Pool:
    def __init__(self, settings: Settings, backend: DockerBackend):
        self.settings = settings
        self.backend = backend
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
                kind = self._kinds[key] = Kind(shape)
                if len(self._kinds) > MAX_SHAPES:
                    oldest = min(self._kinds.values(), key=lambda k: k.used)
                    self._drop(oldest)
        self._wake.set()
        return kind

    def claim(self, shape: dict[str, Any]) -> Warm | None:
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
            self._wake.wait(1.0)
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
            box = start_warm(self.backend, kind.shape)
        except (QuineboxError, OSError) as exc:  # the engine refused or did not answer: say so, wait, and try again (a bug propagates)
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


def start_warm(backend: DockerBackend, shape: dict[str, Any]) -> Warm:
    """Create and start a box of `shape` and take its lifeline; on any failure nothing is left behind."""
    box = new_session_id()
    path = str(run_dir() / f"{POOL_SESSION}{box}.sock")
    listener = box_socket(path, backlog=16)
    world = None
    container = None
    try:
        if has_world(shape):
            world = str(pool_dir() / box / "tree")
            os.makedirs(world, 0o755)
            if os.getuid() == 0:
                os.chown(world, *box_user(shape))
        created = datetime.now(UTC).isoformat(timespec="seconds")
        config = warm_config(shape, box=box, lifeline=path, world=world, owner=owner_id(), created=created)
        container = backend.create(config)
        shell = backend.exists(container, "/bin/sh")
        attach = backend.attach(container)
        backend.start(container)
        listener.settimeout(START_TIMEOUT)
        lifeline, _ = listener.accept()
        listener.settimeout(None)
        lifeline.settimeout(None)
        return Warm(box=box, container=container, listener=listener, lifeline=lifeline, attach=attach, socket_path=path, world=world, shell=shell)
    except BaseException:
        if container is not None:
            backend.remove(container)
        listener.close()
        os.unlink(path)
        if world is not None:
            shutil.rmtree(os.path.dirname(world), ignore_errors=True)
        raise


# -- the keeper: the pool's own process ---------------------------------------------------------


def die_with_parent(parent: int, signum: int = signal.SIGKILL) -> None:
    """Be sent `signum` when `parent` dies, however it dies (Linux's PR_SET_PDEATHSIG); gone already, go now."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signum)
    if os.getppid() != parent:
        os._exit(125)


class Stopping(Exception):
    """SIGTERM reached the keeper (`serve stop`, or its server died): raised in its main thread, out of `accept`."""


def default_shape(backend: DockerBackend) -> dict[str, Any] | None:
    """The shape of `quinebox exec -- CMD` and `quinebox run MISSION` with no options (one shape: both are the same box)."""
    spec, _, config = configure(build_spec(["true"]), backend)
    return shape_of(spec, config)


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
    backend, waited = None, False
    while backend is None:  # an engine not up yet: boxes start cold (no pool.sock) until it is
        try:
            backend = DockerBackend.connect()
        except EngineError as exc:
            if not waited:
                print(f"quinebox pool: waiting for the engine: {exc}", file=sys.stderr, flush=True)
            waited = True
            time.sleep(BACKOFF)
    pool = Pool(settings, backend)
    bound: tuple[socket.socket, os.stat_result] | None = None  # pool.sock, and the file it is, once listening
    try:
        listener = fdpass.listen(str(pool_socket()), mode=0o600, backlog=64)
        bound = listener, os.stat(pool_socket())
        if settings.size:
            try:
                shape = default_shape(backend)
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
    with conn:
        if fdpass.peer_uid(conn) != os.getuid():
            return
        try:
            message, fds = fdpass.receive(conn, 2.0)
        except OSError:
            return
        for fd in fds:
            os.close(fd)
        if message.get("kind") == "stats":
            fdpass.send(conn, {"kind": "stats", "pid": os.getpid(), "settings": pool.settings.__dict__, "shapes": pool.stats()})
            return
        shape = message.get("shape")
        box = pool.claim(shape) if message.get("kind") == "claim" and well_formed(shape) and pool.settings.size else None
        if box is None:
            fdpass.send(conn, {"kind": "miss"})
            return
        try:
            answer = {"kind": "claimed", "container": box.container, "box": box.box, "lifeline": box.socket_path, "world": box.world, "shell": box.shell}
            fdpass.send(conn, answer, [box.listener.fileno(), box.lifeline.fileno(), box.attach.fileno()])
        except OSError:
            box.discard()  # the claimer went away: nobody holds it
            return
        box.close_sockets()  # the claimer holds its own copies, and the box's paths are the claimer's to move

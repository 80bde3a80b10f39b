"""A Sandbox's time: paused and resumed, checkpointed into a snapshot, forked into copies that go on from one instant.

The part of `quinebox.Sandbox` (sandbox.py) that stops and copies its box, over box/live/freezing.py (pause, the
markers every process reads), checkpoints.py (a snapshot taken on gVisor, a copy's spec) and snapshots.py (where
snapshots lie, sealed). The box's owner does each of them — only it runs the box's clocks and waits for its init —
so a Sandbox also answers them for the user's other processes (controls.py: `quinebox box pause ID` and the rest).

    sb.pause(); sb.resume()                      # every process stopped, then on; the TTL and idle clocks stand still
    snap = sb.checkpoint()                       # memory, processes, open files, tmpfs and /world, at one instant
    copy = quinebox.Sandbox.restore(snap)        # a new live box from it (a new id), and the original goes on
    copies = sb.fork(4)                          # four copies, each from the same instant, each with its own world
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Self

from quinebox.audit import log
from quinebox.box.live import checkpoints, controls, freezing, snapshots
from quinebox.box.live.checkpoints import Live
from quinebox.box.live.execs import BoxExec, Target
from quinebox.box.live.sandboxes import Record, busy
from quinebox.box.live.snapshots import Snapshot
from quinebox.box.process import BoxProcess
from quinebox.errors import QuineboxError

#: The most copies one fork makes.
MAX_FORK = 64
#: The threads the async twins run on: quinebox's own, made as they are needed, not the event loop's default executor
#: (min(32, cpus + 4) threads, which as many long `aexec`s fill, stalling every other call of the loop and its getaddrinfo).
THREADS = ThreadPoolExecutor(max_workers=64, thread_name_prefix="quinebox-async")


class _Call:
    """The execs one async twin's call started in its thread: killed when the task awaiting it is cancelled (a
    cancelled `aexec`, as asyncio.wait_for's, ends its command rather than leave it running on)."""

    def __init__(self) -> None:
        self.started: list[Any] = []
        self.cancelled = False
        self.lock = threading.Lock()

    def add(self, proc: Any) -> None:
        with self.lock:
            if not self.cancelled:
                self.started.append(proc)
                return
        proc.kill()  # started after the cancel: ended at once

    def cancel(self) -> None:
        with self.lock:
            self.cancelled = True
            started = list(self.started)
        for proc in started:
            proc.kill()


#: The call an async twin's thread runs for, as its context carries it (None in a call not made by a twin).
_CALL: contextvars.ContextVar[_Call | None] = contextvars.ContextVar("quinebox_async_call", default=None)


class SandboxTime:
    """Pause, resume, checkpoint and fork for a Sandbox (which sets these attributes and defines `restore`)."""

    id: str
    target: Target
    _box: BoxProcess | None
    _record: Record
    _diagnostics: list[bytes]
    _execs: weakref.WeakSet[BoxExec]
    _closed: bool

    if TYPE_CHECKING:

        @classmethod
        def restore(cls, snapshot: str | Snapshot, *, ttl: float | str | None = None, name: str | None = None, _checked: bool = False) -> Self: ...

        def _alive(self) -> None: ...

        def close(self) -> None: ...

        def destroy(self) -> None: ...

        @classmethod
        def connect(cls, ref: str) -> Self: ...

        @classmethod
        def detached(cls, **options: Any) -> Self: ...

        @property
        def _owned(self) -> BoxProcess: ...

    @property
    def paused(self) -> bool:
        """Whether the box is paused (by this process or any other of its user's)."""
        return freezing.pause_of(self.id) is not None

    def pause(self) -> None:
        """Stop every process of the box where it is; its TTL and idle clocks stand still until `resume`. Execs into
        it are refused meanwhile, in one line. An attached Sandbox asks the box's owner, as `quinebox box pause` does."""
        if self._box is None:
            self._ask("pause")
            return
        self._alive()
        freezing.pause(self.target.box, self.id)
        self._box.hold_deadline()
        log.note("box_paused", self.id)

    def resume(self) -> None:
        """Let every process of the box go on, and its clocks with them."""
        if self._box is None:
            self._ask("resume")
            return
        self._alive()
        paused = freezing.resume(self.target.box, self.id)
        freezing.idle_clock_stood(self.id, self._record.created, paused)
        self._box.release_deadline()
        log.note("box_resumed", self.id, paused_s=round(paused, 3))

    def checkpoint(self, *, _transient: bool = False) -> Snapshot:
        """A snapshot of the box at one instant — memory, processes, open files, every tmpfs, /world — sealed as
        this user's (`quinebox box snapshots` lists them); the box goes on. On gVisor (runtime="runsc") only;
        what it cannot carry is refused in one line (QuineboxError), and the box goes on as it was. An attached
        Sandbox asks the box's owner, as `quinebox box checkpoint` does."""
        if self._box is None:
            return snapshots.find(self._ask("checkpoint", transient=_transient)["snapshot"])
        self._alive()
        return checkpoints.take(self._live(), transient=_transient)

    def fork(self, n: int) -> list[Self]:
        """`n` live copies of the box, each from the same instant, each with a world of its own; the box goes on.
        Each copy is owned by this process (an attached Sandbox's copies too) and has its own id."""
        if not 1 <= n <= MAX_FORK:
            raise QuineboxError(f"bad fork count {n}: make 1 to {MAX_FORK} copies at once")
        snapshot = self.checkpoint(_transient=True)
        try:
            with ThreadPoolExecutor(max_workers=n) as pool:
                made = [pool.submit(self.restore, snapshot, _checked=True) for _ in range(n)]
            failed = [future.exception() for future in made if future.exception() is not None]
            if failed:
                for future in made:
                    if future.exception() is None:
                        future.result().close()
                raise failed[0]  # type: ignore[misc]  # an exception, as filtered above
            return [future.result() for future in made]
        finally:
            snapshots.remove(snapshot)

    def _live(self) -> Live:
        box = self._owned
        return Live(self.id, box.spec, self.target.box, box.broker, box.image_id or "", self._busy, self._successor_stdio)

    def _busy(self) -> bool:
        return busy(self.id) or any(proc.returncode is None and proc.poll() is None for proc in list(self._execs))

    def _successor_stdio(self) -> tuple[int, int, int]:
        """What the box's successor after a checkpoint has as its stdin, stdout and stderr (a long-lived box's main
        process has /dev/null for both of the first): its stderr comes to `diagnostics()`, as its first's did."""
        read_end, write_end = os.pipe()
        threading.Thread(target=_drain, args=(read_end, self._diagnostics.append), daemon=True).start()
        return os.open(os.devnull, os.O_RDONLY), os.open(os.devnull, os.O_WRONLY), write_end

    def _ask(self, op: str, **args: Any) -> dict[str, Any]:
        """The box's owner's answer (controls.py), as `quinebox box pause` and the rest ask it."""
        self._alive()
        return controls.ask(self.id, {"op": op, **args})

    def _control(self, request: dict[str, Any]) -> dict[str, Any]:
        """A request about the box from another process of this user's (controls.py)."""
        op = request.get("op")
        if op == "pause":
            self.pause()
            return {"box": self.id}
        if op == "resume":
            self.resume()
            return {"box": self.id}
        if op == "checkpoint":
            made = self.checkpoint(_transient=bool(request.get("transient")))
            return {"box": self.id, "snapshot": made.id, "bytes": made.size}
        if op == "destroy":  # answered first: the box goes once the answer is out, and a holder with it
            threading.Thread(target=self.close, name=f"destroy:{self.id}", daemon=True).start()
            return {"box": self.id}
        raise QuineboxError(f"unknown request {op!r} for box {self.id}")

    # -- async twins (of these, and of the Sandbox's own life) ---------------------------------------------------------------------------

    def _started(self, proc: Any) -> Any:
        """`proc`, an exec just started, known to the async twin whose call started it (see _Call)."""
        call = _CALL.get()
        if call is not None:
            call.add(proc)
        return proc

    async def _in_thread(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        """`call(*args, **kwargs)` on quinebox's threads; cancelled, the execs it started are killed."""
        mine = _Call()
        context = contextvars.copy_context()
        context.run(_CALL.set, mine)
        try:
            return await asyncio.get_running_loop().run_in_executor(THREADS, context.run, functools.partial(call, *args, **kwargs))
        except asyncio.CancelledError:
            mine.cancel()
            raise

    async def aclose(self) -> None:
        await self._in_thread(self.close)

    async def adestroy(self) -> None:
        await self._in_thread(self.destroy)

    @classmethod
    async def acreate(cls, **options: Any) -> Self:
        """`Sandbox(**options)` without blocking the event loop while the box starts."""
        return await asyncio.get_running_loop().run_in_executor(THREADS, functools.partial(cls, **options))

    @classmethod
    async def aconnect(cls, ref: str) -> Self:
        return await asyncio.get_running_loop().run_in_executor(THREADS, cls.connect, ref)

    @classmethod
    async def adetached(cls, **options: Any) -> Self:
        return await asyncio.get_running_loop().run_in_executor(THREADS, functools.partial(cls.detached, **options))

    async def apause(self) -> None:
        await self._in_thread(self.pause)

    async def aresume(self) -> None:
        await self._in_thread(self.resume)

    async def acheckpoint(self) -> Snapshot:
        return await self._in_thread(self.checkpoint)

    async def afork(self, n: int) -> list[Self]:
        return await self._in_thread(self.fork, n)

    @classmethod
    async def arestore(cls, snapshot: str | Snapshot, **options: Any) -> Self:
        """`Sandbox.restore(snapshot, **options)` without blocking the event loop."""
        return await asyncio.get_running_loop().run_in_executor(THREADS, functools.partial(cls.restore, snapshot, **options))


def _drain(fd: int, sink: Any) -> None:
    try:
        while chunk := os.read(fd, 65536):
            sink(chunk)
    finally:
        os.close(fd)


def snapshot_facts(snapshot: Snapshot) -> dict[str, Any]:
    """A snapshot as `box snapshots --json` and the MCP tools show it."""
    return {
        "snapshot": snapshot.id, "box": snapshot.box, "created": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(snapshot.created)),
        "bytes": snapshot.size, "image": snapshot.recipe.image, "grants": list(snapshot.recipe.grants), "runtime": snapshot.recipe.runtime,
        "transient": snapshot.transient,
    }

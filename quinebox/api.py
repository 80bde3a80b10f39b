"""The Python API, shaped like `subprocess`: `exec` → a completed result, `Popen` to stream.

A box's lifetime, in order: spec (checked), policy (pure), lifeline socket,
create, subscribe to its events, attach, start; then streams flow until the
engine reports `die` (with the exit code) and `destroy` (the box is gone).
The engine's events, not the box, are the authority on exit code and OOM.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, AsyncIterator, Callable, Iterable, Sequence, Union

from quinebox import streams
from quinebox.backends.docker import DockerBackend
from quinebox.broker import Broker, Handler
from quinebox.policy import container_config, native_arch
from quinebox.resources import resource_path
from quinebox.spec import BoxSpec, build_spec

if TYPE_CHECKING:
    from quinebox.supervisor import Node

PIPE = -1
DEVNULL = -3
EXIT_TIMEOUT = 124
#: How long the engine may take to remove a box after it stopped before we insist.
REMOVAL_GRACE = 10.0

Stream = Union[None, int, IO[Any], Callable[[bytes], None]]


@functools.lru_cache(maxsize=1)
def _seccomp_base() -> dict[str, Any]:
    return json.loads(resource_path("sandbox", "seccomp", "quinebox.json").read_text())


@dataclass(frozen=True)
class ExecResult:
    """A finished box: what `quinebox.exec` returns."""

    argv: tuple[str, ...]
    returncode: int
    stdout: bytes
    stderr: bytes
    timed_out: bool
    oom_killed: bool
    session: str
    duration_s: float


class Popen:
    """A box running one command, with its streams connected like subprocess.Popen's.

    stdin, stdout, stderr: None inherits this process's fd 0/1/2; PIPE gives
    `.stdin` (write, close() for EOF) / `.stdout` / `.stderr` (read); DEVNULL;
    a file descriptor or file object; for stdout/stderr also a callable that
    receives each chunk as it arrives.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        grants: Iterable[str] = (),
        policy: str | None = None,
        timeout: float | str | None = None,
        image: str | None = None,
        workdir: str | None = None,
        world: str | None = None,
        world_from: str | Sequence[str] | None = None,
        world_tar: str | None = None,
        stdin: Stream | bytes = None,
        stdout: Stream = None,
        stderr: Stream = None,
        backend: DockerBackend | None = None,
        spec: BoxSpec | None = None,
        handler: Handler | None = None,
        spawner: "Node | None" = None,
    ):
        self.spec = spec or build_spec(
            argv, grants=grants, policy=policy, timeout=timeout, image=image, workdir=workdir, world=world, world_from=world_from, world_tar=world_tar
        )
        self.args = self.spec.argv
        self.session = self.spec.session
        self.returncode: int | None = None
        self.timed_out = False
        self.oom_killed = False
        self.stdin: streams.StdinWriter | None = None
        self.stdout: IO[bytes] | None = None
        self.stderr: IO[bytes] | None = None
        self.id: str | None = None
        self._exit_code: int | None = None
        self._died = threading.Event()
        self._destroyed = threading.Event()
        self._pipe_ends: list[int] = []
        self._demux: threading.Thread | None = None
        self._pump: threading.Thread | None = None
        self._stop_r, self._stop_w = os.pipe()
        self._deadline: threading.Timer | None = None
        self._closed = False
        self._finishing = threading.Lock()
        #: Why the host killed the box for its world (it grew past its world:SIZE grant), if it did.
        self.world_full: str | None = None

        from quinebox.supervisor import Node

        config = container_config(self.spec, seccomp=_seccomp_base(), arch=native_arch())
        self._backend = backend or DockerBackend.shared()
        #: This box's place in its process tree; a box started here is a root.
        self.node = spawner or Node.root(self.spec)
        if self.node.box is None:
            self.node.box = self
        self._broker = Broker(self.spec.lifeline, handler, self.node) if self.spec.lifeline else None
        try:
            if self.spec.world is not None:
                from quinebox.worlds import open_world

                self.node.world = open_world(self.spec, on_full=self._world_full)
                if self.node.session is not None:  # an agent's session revises the world after its tools
                    self.node.session.world = self.node.world
            self.id = self._backend.create(config)
            self._events = self._backend.events(self.id)
            self._spawn(self._follow_events, "events")
            self._sock = self._backend.attach(self.id)
            self._connect_outputs(stdout, stderr)
            self._backend.start(self.id)
            self.started = time.monotonic()
            self._connect_stdin(stdin)
            if self.spec.grants.time:
                self._deadline = threading.Timer(self.spec.grants.time, self._expire)
                self._deadline.daemon = True
                self._deadline.start()
        except BaseException:
            if self.id:
                self._backend.remove(self.id)
            self._close()
            self._end_world(started=False)
            raise

    # -- wiring -----------------------------------------------------------------

    def _spawn(self, target: Callable[..., None], name: str, *args: Any) -> threading.Thread:
        thread = threading.Thread(target=target, args=args, name=f"{name}:{self.session}", daemon=True)
        thread.start()
        return thread

    def _sink(self, target: Stream, fd: int, attr: str) -> streams.Sink:
        if target is None:
            return streams.fd_sink(fd)
        if target == DEVNULL:
            return streams.discard
        if target == PIPE:
            read_end, write_end = os.pipe()
            setattr(self, attr, os.fdopen(read_end, "rb"))
            self._pipe_ends.append(write_end)
            return streams.fd_sink(write_end)
        if callable(target):
            return target
        return streams.fd_sink(target if isinstance(target, int) else target.fileno())

    def _connect_outputs(self, stdout: Stream, stderr: Stream) -> None:
        out = self._guard(self._sink(stdout, 1, "stdout"))
        err = self._guard(self._sink(stderr, 2, "stderr"))
        reader = self._sock.makefile("rb", buffering=streams.CHUNK)
        self._demux = self._spawn(self._relay, "demux", reader, out, err)

    def _guard(self, sink: streams.Sink) -> streams.Sink:
        """A reader that went away stops the box, as SIGPIPE would stop a process."""
        broken = False

        def write(data: bytes) -> None:
            nonlocal broken
            if broken:
                return
            try:
                sink(data)
            except BrokenPipeError:
                broken = True
                self.broken_pipe = True
                # Not from this thread: the engine finishes a kill only after
                # the box's output is drained, and this thread is the drain.
                threading.Thread(target=self.kill, daemon=True).start()

        return write

    broken_pipe = False

    def _relay(self, reader: IO[bytes], out: streams.Sink, err: streams.Sink) -> None:
        try:
            streams.demux(reader, out, err)
        except OSError:
            pass
        finally:
            reader.close()
            for fd in self._pipe_ends:
                os.close(fd)
            self._pipe_ends = []

    def _connect_stdin(self, stdin: Stream | bytes) -> None:
        if stdin == PIPE:
            self.stdin = streams.StdinWriter(self._sock)
        elif stdin == DEVNULL:
            streams.StdinWriter(self._sock).close()
        elif isinstance(stdin, (bytes, bytearray, memoryview)):
            self._pump = self._spawn(streams.pump_bytes, "stdin", bytes(stdin), self._sock)
        else:
            fd = 0 if stdin is None else stdin if isinstance(stdin, int) else stdin.fileno()
            self._pump = self._spawn(streams.pump_fd, "stdin", fd, self._sock, self._stop_r)

    def _follow_events(self) -> None:
        try:
            for event in self._events:
                action = event.get("Action") or event.get("status")
                if action == "oom":
                    self.oom_killed = True
                elif action == "die":
                    self._exit_code = int(event.get("Actor", {}).get("Attributes", {}).get("exitCode", 137))
                    self._died.set()
                elif action == "destroy":
                    break
        except Exception:
            pass  # the engine closed the stream; wait() will check on the box itself
        finally:
            self._died.set()
            self._destroyed.set()

    def _expire(self) -> None:
        self.timed_out = True
        self.kill()

    def _world_full(self, message: str) -> None:
        self.world_full = message
        self.kill()

    def _end_world(self, *, started: bool = True) -> None:
        """The world's last revision; a box that never started leaves no world, a command's unused world is removed."""
        world, self.node.world = self.node.world, None
        if world is None:
            return
        from quinebox.worlds import discard, end_world

        if started:
            end_world(world, keep_unused=self.spec.agent)
        else:
            world.close()
            discard(self.session)

    # -- the subprocess-like surface ---------------------------------------------

    def kill(self) -> None:
        """SIGKILL everything in the box; the engine then removes it."""
        if self.id and not self._died.is_set():
            self._backend.kill(self.id)

    terminate = kill

    def poll(self) -> int | None:
        if self.returncode is None and self._destroyed.is_set():
            return self.wait()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the box to exit and be removed; return its exit status.

        Any exception here (KeyboardInterrupt included) kills the box first,
        so no box outlives the call that was waiting for it.
        """
        if self.returncode is not None:
            return self.returncode
        limit = None if timeout is None else time.monotonic() + timeout
        try:
            while not self._died.wait(0.05 if limit is None else max(0.0, min(0.05, limit - time.monotonic()))):
                if limit is not None and time.monotonic() >= limit:
                    raise TimeoutError(f"box {self.session} still running after {timeout} s")
            if self._demux is not None:
                self._demux.join(REMOVAL_GRACE)
            if not self._destroyed.wait(REMOVAL_GRACE):
                self._backend.remove(self.id)
        except TimeoutError:
            raise
        except BaseException:
            self.kill()
            self._destroyed.wait(REMOVAL_GRACE) or self._backend.remove(self.id)
            self._close()
            raise
        with self._finishing:  # a parent's node and the tree's end may wait on one box at once
            if self.returncode is None:
                self._close()
                self._end_world()
                if self.node.parent is None:
                    self.node.end_tree()
                code = self._exit_code if self._exit_code is not None else 137
                self.returncode = EXIT_TIMEOUT if self.timed_out else code
        return self.returncode

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._deadline:
            self._deadline.cancel()
        os.write(self._stop_w, b"x")
        if self._pump is not None:
            self._pump.join(1.0)  # it leaves as soon as it sees the stop
        os.close(self._stop_w)
        os.close(self._stop_r)
        for closer in (getattr(self, "_events", None), getattr(self, "_sock", None), self._broker):
            if closer is not None:
                try:
                    closer.close()
                except OSError:
                    pass
        for fd in self._pipe_ends:
            os.close(fd)
        self._pipe_ends = []

    def __enter__(self) -> "Popen":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.stdin:
            self.stdin.close()
        self.wait()


def _captured(start: Callable[..., Any], input: bytes | None) -> tuple[Any, int, bytes, bytes]:
    """Start a box with `input` as its whole stdin and its outputs collected; wait for it."""
    out: list[bytes] = []
    err: list[bytes] = []
    box = start(stdin=input if input is not None else DEVNULL, stdout=out.append, stderr=err.append)
    code = box.wait()
    return box, code, b"".join(out), b"".join(err)


def exec(
    argv: Sequence[str],
    *,
    input: bytes | None = None,
    grants: Iterable[str] = (),
    policy: str | None = None,
    timeout: float | str | None = None,
    image: str | None = None,
    workdir: str | None = None,
    world: str | None = None,
    world_from: str | Sequence[str] | None = None,
    world_tar: str | None = None,
) -> ExecResult:
    """Run `argv` in a fresh box and collect its output, like `subprocess.run(capture_output=True)`.

    `input` is the box's whole stdin (empty when None). A `timeout` that runs
    out kills the box and gives returncode 124 rather than raising. The box's
    /world is `world` (a host directory, read-write), copies of the host paths
    in `world_from`, the contents of the archive `world_tar`, or empty.
    """
    began = time.monotonic()
    options = {"world": world, "world_from": world_from, "world_tar": world_tar}
    proc, code, out, err = _captured(
        lambda **streams: Popen(argv, grants=grants, policy=policy, timeout=timeout, image=image, workdir=workdir, **options, **streams), input
    )
    return ExecResult(
        argv=proc.args,
        returncode=code,
        stdout=out,
        stderr=err,
        timed_out=proc.timed_out,
        oom_killed=proc.oom_killed,
        session=proc.session,
        duration_s=time.monotonic() - began,
    )


@dataclass(frozen=True)
class RunResult(ExecResult):
    """A finished mission: what `quinebox.run` returns. `argv` is the box's, `mission` the agent's."""

    mission: str = ""
    termination: str = ""
    tokens: int = 0
    turns: int = 0


def run(
    mission: str,
    *,
    input: bytes | None = None,
    grants: Iterable[str] = (),
    model: str | None = None,
    timeout: float | str | None = None,
    policy: str | None = None,
    image: str | None = None,
    workdir: str | None = None,
    max_turns: int | None = None,
    max_tokens: int | None = None,
    world: str | None = None,
    world_from: str | Sequence[str] | None = None,
    world_tar: str | None = None,
) -> RunResult:
    """Run an agent on `mission` with `input` as its material; collect the deliverable and diagnostics.

    `model` is a model name at the configured OpenAI-compatible endpoint,
    `script:FILE.yaml`, or `replay:SESSION` (default: QUINEBOX_MODEL).
    """
    from quinebox.agent import Agent

    agent, code, out, err = _captured(
        lambda **streams: Agent(
            mission, model=model, grants=grants, policy=policy, timeout=timeout, image=image,
            workdir=workdir, max_turns=max_turns, max_tokens=max_tokens, world=world, world_from=world_from, world_tar=world_tar, **streams,
        ),
        input,
    )
    outcome = agent.outcome or {}
    return RunResult(
        argv=agent.proc.args,
        returncode=code,
        stdout=out,
        stderr=err,
        timed_out=agent.proc.timed_out,
        oom_killed=agent.proc.oom_killed,
        session=agent.session.session,
        duration_s=float(outcome.get("duration_s", 0.0)),
        mission=mission,
        termination=str(outcome.get("termination")),
        tokens=int(outcome.get("tokens", 0)),
        turns=int(outcome.get("turns", 0)),
    )


WORLD_OPTIONS = ("world", "world_from", "world_tar")


class Box:
    """Defaults for many boxes (image, grants, model, limits); run them one by one or concurrently.

        box = quinebox.Box(model="script:review.yaml", grants=["mem:512m"], timeout="5m")
        result = box.run("review this diff", input=diff)
        async for index, result in box.map("summarize", documents, parallel=8):
            ...
    """

    def __init__(
        self,
        *,
        image: str | None = None,
        grants: Iterable[str] = (),
        model: str | None = None,
        timeout: float | str | None = None,
        policy: str | None = None,
        max_turns: int | None = None,
        max_tokens: int | None = None,
    ):
        self.defaults: dict[str, Any] = {
            "image": image, "grants": tuple(grants), "model": model, "timeout": timeout,
            "policy": policy, "max_turns": max_turns, "max_tokens": max_tokens,
        }

    def _options(self, overrides: dict[str, Any], *names: str) -> dict[str, Any]:
        merged = {**self.defaults, **overrides}
        if "grants" in overrides:
            merged["grants"] = (*self.defaults["grants"], *overrides["grants"])
        return {name: merged[name] for name in names if name in merged}

    def run(self, mission: str, *, input: bytes | None = None, **overrides: Any) -> RunResult:
        options = self._options(overrides, "image", "grants", "model", "timeout", "policy", "max_turns", "max_tokens", "workdir", *WORLD_OPTIONS)
        return run(mission, input=input, **options)

    def exec(self, argv: Sequence[str], *, input: bytes | None = None, **overrides: Any) -> ExecResult:
        return exec(argv, input=input, **self._options(overrides, "image", "grants", "timeout", "policy", "workdir", *WORLD_OPTIONS))

    async def spawn(self, mission: str, *, input: bytes | None = None, **overrides: Any) -> RunResult:
        """`run` without blocking the event loop."""
        import asyncio

        return await asyncio.get_running_loop().run_in_executor(None, functools.partial(self.run, mission, input=input, **overrides))

    async def map(self, mission: str, inputs: Iterable[bytes], *, parallel: int = 4, **overrides: Any) -> AsyncIterator[tuple[int, RunResult]]:
        """One agent per input, `parallel` at a time; yields (input index, result) as each finishes."""
        import asyncio
        from concurrent.futures import ThreadPoolExecutor

        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="quinebox-map") as pool:

            async def one(index: int, data: bytes) -> tuple[int, RunResult]:
                result = await loop.run_in_executor(pool, functools.partial(self.run, mission, input=data, **overrides))
                return index, result

            tasks = [asyncio.ensure_future(one(i, data)) for i, data in enumerate(inputs)]
            try:
                for finished in asyncio.as_completed(tasks):
                    yield await finished
            finally:
                for task in tasks:
                    task.cancel()


__all__ = ["exec", "run", "Box", "Popen", "ExecResult", "RunResult", "PIPE", "DEVNULL"]

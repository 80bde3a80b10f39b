"""The Python API, shaped like `subprocess`: `exec` → a completed result, `Popen` to stream, `run` an agent (`resume` one).

The friendly layer over `box.process.BoxProcess` (one box from a resolved
spec) and `tree.agent.Agent`: options in, a spec built and checked, the box the
root of a process tree of its own.
"""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator, Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quinebox.box.policy import AGENT_COMMAND
from quinebox.box.process import DEVNULL, PIPE, BoxProcess, Stream
from quinebox.box.spec import build_spec
from quinebox.tree.supervisor import Node, start_agent

if TYPE_CHECKING:
    from quinebox.box.backends.docker import DockerBackend


@dataclass(frozen=True)
class ExecResult:
    """A finished box (what `quinebox.exec` returns), or a command in one (`Sandbox.exec`). `truncated`: output past
    the exec's `max_output` was dropped."""

    argv: tuple[str, ...]
    returncode: int
    stdout: bytes
    stderr: bytes
    timed_out: bool
    oom_killed: bool
    session: str
    duration_s: float
    truncated: bool = False

    @property
    def args(self) -> tuple[str, ...]:
        """The command, by subprocess.CompletedProcess's name for it."""
        return self.argv


class Popen(BoxProcess):
    """A box running one command, with its streams connected like subprocess.Popen's.

    stdin, stdout, stderr: None inherits this process's fd 0/1/2; PIPE gives
    `.stdin` (write, close() for EOF) / `.stdout` / `.stderr` (read); DEVNULL;
    a file descriptor or file object; for stdout/stderr also a callable that
    receives each chunk as it arrives. The box is the root of a tree of its
    own: with `spawn:N` and `depth:N` what runs in it may start boxes too.
    `image` may be any image (`pull`: missing, always or never); with no argv
    the box runs the image's entrypoint and command. `tty` gives the box a
    pseudo-terminal: its output then arrives as one stream, on stdout.
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
        pull: str = "missing",
        tty: bool = False,
        ask: Iterable[str] = (),
        deny: Iterable[str] = (),
        ask_timeout: float | str | None = None,
        stdin: Stream | bytes = None,
        stdout: Stream = None,
        stderr: Stream = None,
        backend: DockerBackend | None = None,
    ):
        spec = build_spec(
            argv, grants=grants, policy=policy, timeout=timeout, image=image, workdir=workdir,
            world=world, world_from=world_from, world_tar=world_tar, pull=pull, tty=tty, ask=ask, deny=deny, ask_timeout=ask_timeout,
        )
        super().__init__(spec, stdin=stdin, stdout=stdout, stderr=stderr, backend=backend, place=Node.root(spec))


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
    pull: str = "missing",
    ask: Iterable[str] = (),
    deny: Iterable[str] = (),
    ask_timeout: float | str | None = None,
) -> ExecResult:
    """Run `argv` in a fresh box and collect its output, like `subprocess.run(capture_output=True)`.

    `input` is the box's whole stdin (empty when None). A `timeout` that runs
    out kills the box and gives returncode 124 rather than raising. The box's
    /world is `world` (a host directory, read-write), copies of the host paths
    in `world_from`, the contents of the archive `world_tar`, or empty.
    `ask` rules (grant strings) are not held but may be approved by a person
    (`quinebox approve`, or the terminal) within `ask_timeout`; `deny` rules
    refuse whatever they cover, held or approved.
    """
    began = time.monotonic()
    options: dict[str, Any] = {"world": world, "world_from": world_from, "world_tar": world_tar, "pull": pull, "ask": ask, "deny": deny, "ask_timeout": ask_timeout}
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
    pull: str = "missing",
    ask: Iterable[str] = (),
    deny: Iterable[str] = (),
    ask_timeout: float | str | None = None,
) -> RunResult:
    """Run an agent on `mission` with `input` as its material; collect the deliverable and diagnostics.

    `model` is a model name at the configured OpenAI-compatible endpoint,
    `script:FILE.yaml`, or `replay:SESSION` (default: QUINEBOX_MODEL).
    """
    agent, code, out, err = _captured(
        lambda **streams: start_agent(
            mission, model=model, grants=grants, policy=policy, timeout=timeout, image=image,
            workdir=workdir, max_turns=max_turns, max_tokens=max_tokens, world=world, world_from=world_from, world_tar=world_tar, pull=pull,
            ask=ask, deny=deny, ask_timeout=ask_timeout, **streams,
        ),
        input,
    )
    return _run_result(agent, code, out, err)


def resume(session: str, *, input: bytes | None = None) -> RunResult:
    """Go on with the interrupted `session` (its process was lost before it ended) from its last complete turn, as
    `quinebox resume` does: its conversation, its world as it was then, its budgets as spent, the turn in flight
    run again. `input` is its material again, whole: what the session had read of it is passed over. A session
    that runs, has ended or was pruned raises QuineboxError, and nothing starts."""
    from quinebox.tree.resume import resume_agent

    agent, code, out, err = _captured(lambda **streams: resume_agent(session, **streams), input)
    return _run_result(agent, code, out, err)


def _run_result(agent: Any, code: int, out: bytes, err: bytes) -> RunResult:
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
        mission=agent.session.mission,
        termination=str(outcome.get("termination")),
        tokens=int(outcome.get("tokens", 0)),
        turns=int(outcome.get("turns", 0)),
    )


WORLD_OPTIONS = ("world", "world_from", "world_tar")
ASK_OPTIONS = ("ask", "deny", "ask_timeout")


class Box:
    """Defaults for many boxes (image, grants, model, limits); run them one by one or concurrently.

        box = quinebox.Box(model="script:review.yaml", grants=["mem:512m"], timeout="5m")
        result = box.run("review this diff", input=diff)
        async for index, result in box.map("summarize", documents, parallel=8):
            ...

    With `cluster` (a Ray address, as for `quinebox map --cluster`) `run` and `map` place
    their agents on the cluster's nodes; `forward_env` names what the nodes' brokers are given.
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
        pull: str = "missing",
        ask: Iterable[str] = (),
        deny: Iterable[str] = (),
        ask_timeout: float | str | None = None,
        cluster: str | None = None,
        forward_env: Iterable[str] = (),
    ):
        self.cluster = cluster
        self.forward_env = tuple(forward_env)
        self.defaults: dict[str, Any] = {
            "image": image, "grants": tuple(grants), "model": model, "timeout": timeout,
            "policy": policy, "max_turns": max_turns, "max_tokens": max_tokens, "pull": pull,
            "ask": tuple(ask), "deny": tuple(deny), "ask_timeout": ask_timeout,
        }

    def _options(self, overrides: dict[str, Any], *names: str) -> dict[str, Any]:
        merged = {**self.defaults, **overrides}
        if "grants" in overrides:
            merged["grants"] = (*self.defaults["grants"], *overrides["grants"])
        return {name: merged[name] for name in names if name in merged}

    def run(self, mission: str, *, input: bytes | None = None, **overrides: Any) -> RunResult:
        if self.cluster is not None:
            results = self._on_cluster(self.cluster, mission, [input], 1, overrides)
            try:
                return next(results)[1]
            finally:
                results.close()
        options = self._options(overrides, "image", "pull", "grants", "model", "timeout", "policy", "max_turns", "max_tokens", "workdir", *WORLD_OPTIONS, *ASK_OPTIONS)
        return run(mission, input=input, **options)

    def exec(self, argv: Sequence[str], *, input: bytes | None = None, **overrides: Any) -> ExecResult:
        return exec(argv, input=input, **self._options(overrides, "image", "pull", "grants", "timeout", "policy", "workdir", *WORLD_OPTIONS, *ASK_OPTIONS))

    async def spawn(self, mission: str, *, input: bytes | None = None, **overrides: Any) -> RunResult:
        """`run` without blocking the event loop."""
        import asyncio

        return await asyncio.get_running_loop().run_in_executor(None, functools.partial(self.run, mission, input=input, **overrides))

    async def map(self, mission: str, inputs: Iterable[bytes], *, parallel: int = 4, **overrides: Any) -> AsyncIterator[tuple[int, RunResult]]:
        """One agent per input, `parallel` at a time; yields (input index, result) as each finishes."""
        import asyncio

        if self.cluster is not None:
            loop = asyncio.get_running_loop()
            results = self._on_cluster(self.cluster, mission, list(inputs), parallel, overrides)
            try:
                while (item := await loop.run_in_executor(None, next, results, None)) is not None:
                    yield item
            finally:
                await loop.run_in_executor(None, results.close)
            return
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

    def _on_cluster(self, address: str, mission: str, inputs: list[bytes | None], parallel: int, overrides: dict[str, Any]) -> Generator[tuple[int, RunResult], None, None]:
        """The cluster's runner over `inputs`, its results as they land; closing this stops what still runs."""
        import contextlib
        import queue
        import tempfile
        import threading

        from quinebox.agent.store import Index
        from quinebox.cluster.connect import connect
        from quinebox.cluster.driver import ClusterRunner
        from quinebox.errors import QuineboxError
        from quinebox.tree.fanout import Job, Options

        options = {**self.defaults, **overrides, "grants": self._options(overrides, "grants")["grants"]}
        local_only = [name for name in ("policy", "workdir", *WORLD_OPTIONS) if options.get(name)]
        if local_only:
            raise QuineboxError(f"{', '.join(local_only)} cannot go to a cluster's nodes: drop them, or run without cluster=")
        cluster = connect(address, self.forward_env)
        timeout = None if options["timeout"] is None else str(options["timeout"])
        jobs = [
            Job(name=f"{index:06d}", source=str(index), mission=mission, material=data, grants=tuple(options["grants"]),
                image=options["image"], model=options["model"], timeout=timeout)
            for index, data in enumerate(inputs)
        ]
        landed: queue.Queue[dict[str, Any] | None] = queue.Queue()
        run_options = Options(
            parallel=parallel, max_turns=options["max_turns"], max_tokens=options["max_tokens"], ask_timeout=options["ask_timeout"],
            ask=tuple(options["ask"]), deny=tuple(options["deny"]),
        )
        sessions = Index()  # the driver's, where each landed session's row now is
        with contextlib.closing(sessions), tempfile.TemporaryDirectory(prefix="quinebox-map-") as out:

            def land(_tally: Any, record: dict[str, Any] | None) -> None:
                if record:
                    landed.put(record)

            runner = ClusterRunner(jobs, out, run_options, land, cluster)

            failed: list[BaseException] = []

            def drive() -> None:
                try:
                    runner.run()
                except BaseException as exc:  # noqa: BLE001 -- raised again in the caller's thread, below
                    failed.append(exc)
                finally:
                    landed.put(None)

            worker = threading.Thread(target=drive, name="quinebox-cluster-map", daemon=True)
            worker.start()
            try:
                while (record := landed.get()) is not None:
                    stdout, stderr = (Path(out, f"{record['name']}.{kind}").read_bytes() for kind in ("out", "err"))
                    row = sessions.get(record["session"]) if record["session"] else None
                    yield int(record["input"]), RunResult(
                        argv=(*AGENT_COMMAND, mission), returncode=record["exit_code"], stdout=stdout, stderr=stderr,
                        timed_out=record["exit_code"] == 124, oom_killed=record["termination"] == "oom", session=record["session"] or "",
                        duration_s=record["duration_s"], mission=mission, termination=str(record["termination"]),
                        tokens=record["tokens"], turns=row.turns if row else 0,
                    )
                if failed:
                    raise failed[0]
            finally:
                runner.stop()
                worker.join()


__all__ = ["exec", "run", "Box", "Popen", "ExecResult", "RunResult", "PIPE", "DEVNULL"]

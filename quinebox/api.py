"""The Python API, shaped like `subprocess`: `exec` → a completed result, `Popen` to stream, `run` an agent
(`resume_session` one), `Runner` many from one set of defaults.

The friendly layer over `box.process.BoxProcess` (one box from a resolved spec) and `tree.agent.Agent`: a box's
options (`BoxOptions`, given whole or by name) in, a spec built and checked, the box the root of a process tree
of its own.
"""

from __future__ import annotations

import functools
import subprocess
import time
import warnings
from collections.abc import AsyncIterator, Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quinebox.box.options import BoxOptions
from quinebox.box.policy import AGENT_COMMAND
from quinebox.box.process import DEVNULL, PIPE, BoxProcess, Stream
from quinebox.box.spec import build_spec
from quinebox.tree.supervisor import Node, start_agent

if TYPE_CHECKING:
    from quinebox.box.backends.docker.engine import DockerBackend


@dataclass(frozen=True)
class ExecResult:
    """A finished box (what `quinebox.exec` returns), or a command in one (`Sandbox.exec`). `truncated`: output past
    the exec's `max_output` was dropped. `args` is the command, by subprocess.CompletedProcess's name for it."""

    args: tuple[str, ...]
    returncode: int
    stdout: bytes
    stderr: bytes
    timed_out: bool
    oom_killed: bool
    session: str
    duration_s: float
    truncated: bool = False

    @property
    def argv(self) -> tuple[str, ...]:
        """Deprecated: `args`, as subprocess says."""
        warnings.warn("ExecResult.argv is deprecated: use .args, as subprocess.CompletedProcess names it", DeprecationWarning, stacklevel=2)
        return self.args

    def check_returncode(self) -> None:
        """subprocess.CalledProcessError if the command did not exit 0 (as CompletedProcess.check_returncode)."""
        if self.returncode:
            raise subprocess.CalledProcessError(self.returncode, self.args, output=self.stdout, stderr=self.stderr)


class Popen(BoxProcess):
    """A box running one command, with its streams connected like subprocess.Popen's.

    The box is `options` (a BoxOptions), or the options given by name (`grants=`, `image=`, `backend=`, …: the
    fields of BoxOptions; another name is a TypeError), or `options` with those given by name replacing its own.
    stdin, stdout, stderr: None inherits this process's fd 0/1/2; PIPE gives
    `.stdin` (write, close() for EOF) / `.stdout` / `.stderr` (read); DEVNULL;
    a file descriptor or file object; for stdout/stderr also a callable that
    receives each chunk as it arrives. The box is the root of a tree of its
    own: with `spawn:N` and `depth:N` what runs in it may start boxes too.
    `image` may be any image (`pull`: missing, always or never); with no argv
    the box runs the image's entrypoint and command. `tty` gives the box a
    pseudo-terminal: its output then arrives as one stream, on stdout.
    `docker`: a connection to the Docker engine to use (its box then runs there).
    """

    def __init__(
        self,
        argv: Sequence[str],
        options: BoxOptions | None = None,
        *,
        tty: bool = False,
        stdin: Stream | bytes = None,
        stdout: Stream = None,
        stderr: Stream = None,
        docker: DockerBackend | None = None,
        **given: Any,
    ):
        spec = build_spec(argv, options, tty=tty, **given)
        super().__init__(spec, stdin=stdin, stdout=stdout, stderr=stderr, backend=docker, place=Node.root(spec))


def _captured(start: Callable[..., Any], input: bytes | None) -> tuple[Any, int, bytes, bytes]:
    """Start a box with `input` as its whole stdin and its outputs collected; wait for it."""
    out: list[bytes] = []
    err: list[bytes] = []
    box = start(stdin=input if input is not None else DEVNULL, stdout=out.append, stderr=err.append)
    code = box.wait()
    return box, code, b"".join(out), b"".join(err)


def exec(argv: Sequence[str], options: BoxOptions | None = None, *, input: bytes | None = None, check: bool = False, **given: Any) -> ExecResult:
    """Run `argv` in a fresh box and collect its output, like `subprocess.run(capture_output=True)`.

    The box is `options` and/or the options given by name, as for `Popen` (grants, policy, timeout, image, pull,
    workdir, world, world_from, world_tar, ask, deny, ask_timeout, backend, runtime, …). `input` is the box's whole
    stdin (empty when None). A `timeout` that runs out kills the box and gives returncode 124 rather than raising.
    The box's /world is `world` (a host directory, read-write), copies of the host paths in `world_from`, the
    contents of the archive `world_tar`, or empty. `ask` rules (grant strings) are not held but may be approved by a
    person (`quinebox approve`, or the terminal) within `ask_timeout`; `deny` rules refuse whatever they cover, held
    or approved. `check`: a returncode other than 0 raises subprocess.CalledProcessError, as subprocess.run's does.
    """
    began = time.monotonic()
    box = BoxOptions.of(options, **given)
    proc, code, out, err = _captured(lambda **streams: Popen(argv, box, **streams), input)
    result = ExecResult(
        args=proc.args,
        returncode=code,
        stdout=out,
        stderr=err,
        timed_out=proc.timed_out,
        oom_killed=proc.oom_killed,
        session=proc.session,
        duration_s=time.monotonic() - began,
    )
    if check:
        result.check_returncode()
    return result


@dataclass(frozen=True)
class RunResult(ExecResult):
    """A finished mission: what `quinebox.run` returns. `args` is the box's command, `mission` the agent's."""

    mission: str = ""
    termination: str = ""
    tokens: int = 0
    turns: int = 0


def run(
    mission: str,
    options: BoxOptions | None = None,
    *,
    input: bytes | None = None,
    check: bool = False,
    model: str | None = None,
    max_turns: int | None = None,
    max_tokens: int | None = None,
    **given: Any,
) -> RunResult:
    """Run an agent on `mission` with `input` as its material; collect the deliverable and diagnostics.

    Its box is `options` and/or the options given by name, as for `exec`. `model` is a model name at the
    configured OpenAI-compatible endpoint, `script:FILE.yaml`, or `replay:SESSION` (default: QUINEBOX_MODEL).
    `check`: an exit status other than 0 raises subprocess.CalledProcessError, as subprocess.run's does.
    """
    box = BoxOptions.of(options, **given)
    agent, code, out, err = _captured(
        lambda **streams: start_agent(mission, box, model=model, max_turns=max_turns, max_tokens=max_tokens, **streams), input
    )
    return _run_result(agent, code, out, err, check)


def resume_session(session: str, *, input: bytes | None = None, check: bool = False, backend: str | None = None, runtime: str | None = None) -> RunResult:
    """Go on with the interrupted agent `session` (its process was lost before it ended) from its last complete
    turn, as `quinebox resume` does: its conversation, its world as it was then, its budgets as spent, the turn in
    flight run again. `input` is its material again, whole: what the session had read of it is passed over. A
    session that runs, has ended or was pruned raises QuineboxError, and nothing starts. `backend`, `runtime`: where
    it runs, unless it was started on one asked for by name. (Not `Sandbox.resume`, which unpauses a box.)"""
    from quinebox.tree.resume import resume_agent

    agent, code, out, err = _captured(lambda **streams: resume_agent(session, backend=backend, runtime=runtime, **streams), input)
    return _run_result(agent, code, out, err, check)


def _run_result(agent: Any, code: int, out: bytes, err: bytes, check: bool = False) -> RunResult:
    outcome = agent.outcome or {}
    result = RunResult(
        args=agent.proc.args,
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
    if check:
        result.check_returncode()
    return result


#: What an agent is given beside its box (`run`'s keywords that are no box option).
AGENT_OPTIONS = ("model", "max_turns", "max_tokens")
#: What a cluster's nodes cannot be given: host paths of this machine, and where this machine runs boxes.
LOCAL_OPTIONS = ("policy", "workdir", "world", "world_from", "world_tar", "world_at", "backend", "runtime")


class Runner:
    """Runs many boxes and agents from one set of defaults, one by one or concurrently (it is no box: each `run`
    and `exec` starts a fresh one; for one box that lasts, see `quinebox.Sandbox`).

        runner = quinebox.Runner(model="script:review.yaml", grants=["mem:512m"], timeout="5m")
        result = runner.run("review this diff", input=diff)
        async for index, result in runner.map("summarize", documents, parallel=8):
            ...

    The defaults are a box's `options` (a BoxOptions) and/or its options by name, and what an agent is given
    (`model`, `max_turns`, `max_tokens`). A call's own keywords win over them; its grants add to theirs. An option
    the call cannot use is a TypeError (`exec` runs no agent: no `model=`). With `cluster` (a Ray address, as for
    `quinebox map --cluster`) `run` and `map` place their agents on the cluster's nodes; `forward_env` names what
    the nodes' brokers are given.
    """

    def __init__(
        self,
        options: BoxOptions | None = None,
        *,
        model: str | None = None,
        max_turns: int | None = None,
        max_tokens: int | None = None,
        cluster: str | None = None,
        forward_env: Iterable[str] = (),
        **given: Any,
    ):
        self.options = BoxOptions.of(options, **given)
        self.agent: dict[str, Any] = {"model": model, "max_turns": max_turns, "max_tokens": max_tokens}
        self.cluster = cluster
        self.forward_env = tuple(forward_env)

    def _box(self, overrides: dict[str, Any]) -> BoxOptions:
        """The defaults with a call's box options: its grants added to theirs, its other options in their place."""
        if "grants" in overrides:
            overrides = {**overrides, "grants": (*self.options.grants, *BoxOptions(grants=overrides["grants"]).grants)}
        return BoxOptions.of(self.options, **overrides)

    def _split(self, overrides: dict[str, Any]) -> tuple[BoxOptions, dict[str, Any]]:
        """A `run`'s keywords: (its box's options, what its agent is given)."""
        agent = {**self.agent, **{name: overrides[name] for name in AGENT_OPTIONS if name in overrides}}
        return self._box({name: value for name, value in overrides.items() if name not in AGENT_OPTIONS}), agent

    def run(self, mission: str, *, input: bytes | None = None, check: bool = False, **overrides: Any) -> RunResult:
        box, agent = self._split(overrides)
        if self.cluster is not None:
            results = self._on_cluster(self.cluster, mission, [input], 1, box, agent)
            try:
                result = next(results)[1]
            finally:
                results.close()
            if check:
                result.check_returncode()
            return result
        return run(mission, box, input=input, check=check, **agent)

    def exec(self, argv: Sequence[str], *, input: bytes | None = None, check: bool = False, **overrides: Any) -> ExecResult:
        return exec(argv, self._box(overrides), input=input, check=check)

    async def spawn(self, mission: str, *, input: bytes | None = None, **overrides: Any) -> RunResult:
        """`run` without blocking the event loop."""
        import asyncio

        return await asyncio.get_running_loop().run_in_executor(None, functools.partial(self.run, mission, input=input, **overrides))

    async def map(self, mission: str, inputs: Iterable[bytes], *, parallel: int = 4, **overrides: Any) -> AsyncIterator[tuple[int, RunResult]]:
        """One agent per input, `parallel` at a time; yields (input index, result) as each finishes."""
        import asyncio

        box, agent = self._split(overrides)  # an unknown option is refused here, before any agent starts
        if self.cluster is not None:
            loop = asyncio.get_running_loop()
            results = self._on_cluster(self.cluster, mission, list(inputs), parallel, box, agent)
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
                result = await loop.run_in_executor(pool, functools.partial(run, mission, box, input=data, **agent))
                return index, result

            tasks = [asyncio.ensure_future(one(i, data)) for i, data in enumerate(inputs)]
            try:
                for finished in asyncio.as_completed(tasks):
                    yield await finished
            finally:
                for task in tasks:
                    task.cancel()

    def _on_cluster(
        self, address: str, mission: str, inputs: list[bytes | None], parallel: int, box: BoxOptions, agent: dict[str, Any]
    ) -> Generator[tuple[int, RunResult], None, None]:
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

        local_only = [name for name in LOCAL_OPTIONS if getattr(box, name)]
        if local_only:
            raise QuineboxError(f"{', '.join(local_only)} cannot go to a cluster's nodes: drop them, or run without cluster=")
        cluster = connect(address, self.forward_env)
        timeout = None if box.timeout is None else str(box.timeout)
        jobs = [
            Job(name=f"{index:06d}", source=str(index), mission=mission, material=data, grants=box.grants,
                image=box.image, model=agent["model"], timeout=timeout)
            for index, data in enumerate(inputs)
        ]
        landed: queue.Queue[dict[str, Any] | None] = queue.Queue()
        run_options = Options(
            parallel=parallel, max_turns=agent["max_turns"], max_tokens=agent["max_tokens"],
            ask_timeout=None if box.ask_timeout is None else str(box.ask_timeout),
            ask=box.ask, deny=box.deny,
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
                        args=(*AGENT_COMMAND, mission), returncode=record["exit_code"], stdout=stdout, stderr=stderr,
                        timed_out=record["exit_code"] == 124, oom_killed=record["termination"] == "oom", session=record["session"] or "",
                        duration_s=record["duration_s"], mission=mission, termination=str(record["termination"]),
                        tokens=record["tokens"], turns=row.turns if row else 0,
                    )
                if failed:
                    raise failed[0]
            finally:
                runner.stop()
                worker.join()


#: Names of one release ago, each now said by the name that means it alone: (new name, why).
DEPRECATED = {
    "Box": ("Runner", "quinebox.Box is now quinebox.Runner: it holds defaults for many runs and is no box"),
    "resume": ("resume_session", "quinebox.resume is now quinebox.resume_session: it resumes an agent's session (Sandbox.resume unpauses a box)"),
}


def __getattr__(name: str) -> Any:
    """An old name still works for one release, with a DeprecationWarning that gives the new one."""
    if name in DEPRECATED:
        new, why = DEPRECATED[name]
        warnings.warn(why, DeprecationWarning, stacklevel=2)
        return globals()[new]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["exec", "run", "resume_session", "Runner", "BoxOptions", "Popen", "ExecResult", "RunResult", "PIPE", "DEVNULL"]

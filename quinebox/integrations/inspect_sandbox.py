"""An Inspect AI sandbox provider: `sandbox="quinebox"` runs each sample's tools in quinebox boxes.

Inspect's docker provider gives each sample a compose project whose containers run as root with the engine's
defaults. This one gives each sample a `quinebox.Sandbox` per configured environment instead: the same hardened
box as `quinebox exec` (no root, no network unless granted, limits, audit), on an OCI runtime where it can run
or on the Docker engine. Inspect finds it through the `inspect_ai` entry point in pyproject.toml and imports it
only then, so this is the one module of quinebox that imports inspect_ai.

A configuration is a YAML file, `sandbox=("quinebox", "quinebox.yaml")` (or `quinebox.yaml` beside the task,
found by itself), or a `QuineboxSandboxConfig`. See docs/inspect.md.

Sandbox calls block, so each runs in a worker thread of its own (never anyio's shared pool of 40, which a
sample's long-running commands would otherwise fill); a cancelled exec kills its command's process tree.
"""

from __future__ import annotations

import errno
import functools
import os
import posixpath
import re
import shlex
import shutil
import threading
import uuid
from collections.abc import Callable
from typing import Any, Literal, TypeVar, overload

import anyio
from inspect_ai.util import (
    ExecResult,
    OutputLimitExceededError,
    SandboxConnection,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    SandboxEnvironmentLimits,
    SandboxUnavailableError,
    SandboxUserUnsupportedError,
    concurrency as inspect_concurrency,
    sandboxenv,
)
from inspect_ai.util._subprocess import max_subprocesses_context_var
from pydantic import BaseModel

from quinebox import DEVNULL, EngineError, FileTooLargeError, GrantError, QuineboxError, Sandbox
from quinebox.integrations.inspect_config import QuineboxEnvironmentConfig, QuineboxSandboxConfig, build_image, load_config

#: The name every box of this provider's starts with: what `quinebox box ls` shows, and `cli_cleanup` removes.
NAME_PREFIX = "inspect-"
#: Config files Inspect looks for beside a task that names `sandbox="quinebox"` without one.
CONFIG_FILES = ["quinebox.yaml", "quinebox.yml"]
#: How many times an exec that quinebox could not get started (the engine wedged) is tried again.
START_RETRIES = 2
#: The longest a read_file or write_file may take, as Inspect's docker provider gives its file copies (a box that
#: stops the reader would otherwise hold it for ever; a FIFO, a socket or a device is refused at once).
FILE_TIMEOUT = 600
#: Each OSError a file operation raises, with the errno Python's own open() would give it.
ERRNOS: dict[type[OSError], int] = {FileNotFoundError: errno.ENOENT, IsADirectoryError: errno.EISDIR, PermissionError: errno.EACCES, NotADirectoryError: errno.ENOTDIR}

T = TypeVar("T")


async def in_thread(call: Callable[..., T], *args: Any, abandon_on_cancel: bool = False, **kwargs: Any) -> T:
    """`call` in a worker thread of its own: a limiter per call, as anyio's shared one of 40 is Inspect's too."""
    return await anyio.to_thread.run_sync(
        functools.partial(call, *args, **kwargs), abandon_on_cancel=abandon_on_cancel, limiter=anyio.CapacityLimiter(1)
    )


def os_error(kind: type[OSError], file: str) -> OSError:
    """An error as Python's open() raises it (errno, strerror, filename), naming the path Inspect asked for."""
    code = ERRNOS.get(kind, errno.EIO)
    return kind(code, os.strerror(code), file)


def box_name(task_name: str, environment: str) -> str:
    """A name `quinebox box ls` shows: the provider's prefix, the task, the sample and epoch, the environment."""
    from inspect_ai.log._samples import sample_active

    active = sample_active()
    sample = f"{active.sample.id}-{active.epoch}" if active is not None else "nosample"
    words = "-".join((task_name[:40], sample[:40], environment[:40]))
    return NAME_PREFIX + re.sub(r"[^A-Za-z0-9_.-]+", "_", words) + "-" + uuid.uuid4().hex[:6]


class ExecRun:
    """One command in a box with Inspect's output limit: each stream kept up to the limit, the command's whole
    process tree killed once either goes past it (so a command printing without end costs the host nothing)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.stdout = bytearray()
        self.stderr = bytearray()
        self.over = False
        self.timed_out = False
        self._proc: Any = None
        self._lock = threading.Lock()

    def _sink(self, kept: bytearray) -> Callable[[bytes], None]:
        def take(chunk: bytes) -> None:
            room = self.limit - len(kept)
            kept.extend(chunk[: max(room, 0)])
            if len(chunk) > room:
                with self._lock:
                    self.over = True
                self.kill()

        return take

    def run(self, sandbox: Sandbox, argv: list[str], *, input: bytes | None, timeout: int | None, **options: Any) -> int:
        proc = sandbox.Popen(argv, stdin=input if input is not None else DEVNULL, stdout=self._sink(self.stdout), stderr=self._sink(self.stderr), **options)
        with self._lock:
            self._proc = proc
            over = self.over
        if over:
            proc.kill()
        code = proc.wait_drained(timeout)
        self.timed_out = bool(proc.timed_out)
        return code

    def kill(self) -> None:
        """End the command's process tree (past the limit, or its caller cancelled); the box stays up."""
        with self._lock:
            proc = self._proc
        if proc is not None:
            proc.kill()

    def output(self) -> str:
        return (bytes(self.stdout) + bytes(self.stderr)).decode(errors="replace")


@sandboxenv(name="quinebox")
class QuineboxSandboxEnvironment(SandboxEnvironment):
    """One quinebox box of a sample: `sandbox()` (its "default" environment) or `sandbox(NAME)`."""

    #: The environments of each task's samples that are still up, so task_cleanup can remove what samples left.
    _live: dict[str, set[QuineboxSandboxEnvironment]] = {}

    def __init__(self, sandbox: Sandbox):
        super().__init__()
        self._sandbox = sandbox

    # -- lifecycle ----------------------------------------------------------------------------

    @classmethod
    def config_files(cls) -> list[str]:
        return CONFIG_FILES

    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return QuineboxSandboxConfig(**config)

    @classmethod
    async def task_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> None:
        """Check the config, and build each Dockerfile it names once for all the task's samples."""
        for env in load_config(config).named().values():
            if env.dockerfile:
                await in_thread(build_image, env)

    @classmethod
    async def sample_init(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, metadata: dict[str, str]
    ) -> dict[str, SandboxEnvironment]:
        """A box per configured environment, made concurrently; "default" first. If any cannot be made, none stays."""
        named = load_config(config).named()
        made: dict[str, QuineboxSandboxEnvironment] = {}
        failed: list[Exception] = []

        async def make(name: str, env: QuineboxEnvironmentConfig) -> None:
            try:
                sandbox = await in_thread(Sandbox, **env.sandbox_options(), name=box_name(task_name, name))
            except Exception as exc:  # noqa: BLE001 whatever a box's start raised, collected: the first is raised as it is, not in an ExceptionGroup
                failed.append(exc)
                return
            made[name] = cls(sandbox)

        try:
            async with anyio.create_task_group() as group:
                for name, env in named.items():
                    group.start_soon(make, name, env)
            if failed:
                raise failed[0]
        except BaseException:
            with anyio.CancelScope(shield=True):
                await cls._close(list(made.values()))
            raise
        cls._live.setdefault(task_name, set()).update(made.values())
        return {name: made[name] for name in named}

    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        """Remove the sample's boxes now, interrupted or not: removing one is quick and says nothing worth keeping."""
        ours = [env.as_type(QuineboxSandboxEnvironment) for env in environments.values()]
        cls._live.get(task_name, set()).difference_update(ours)
        await cls._close(ours)

    @classmethod
    async def task_cleanup(cls, task_name: str, config: SandboxEnvironmentConfigType | None, cleanup: bool) -> None:
        """Remove the boxes of the task's samples that were not cleaned up (unless --no-sandbox-cleanup: they then
        last as long as this process, which owns them)."""
        left = cls._live.pop(task_name, set())
        if cleanup:
            await cls._close(list(left))

    @classmethod
    async def cli_cleanup(cls, id: str | None) -> None:
        """`inspect sandbox cleanup quinebox [ID]`: remove box ID, or every box of this provider's still up (an eval
        that still runs loses its sandboxes), then whatever boxes a crashed eval left (`quinebox gc`)."""
        removed = await in_thread(remove_boxes, id)
        print(f"removed {len(removed)} quinebox box{'es' if len(removed) != 1 else ''}" + (": " + " ".join(removed) if removed else ""))

    @staticmethod
    async def _close(environments: list[QuineboxSandboxEnvironment]) -> None:
        async with anyio.create_task_group() as group:
            for env in environments:
                group.start_soon(functools.partial(in_thread, env._sandbox.close))

    # -- commands ------------------------------------------------------------------------------

    async def exec(
        self,
        cmd: list[str],
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> ExecResult[str]:
        """Run `cmd` in the box, as Inspect's docker provider does, with quinebox's box and user rules.

        The command's `timeout` is quinebox's own (its whole process tree killed, the box left up) and final:
        TimeoutError. What `timeout_retry` retries is quinebox not getting the command started (the engine
        wedged; nothing ran), up to twice. `user` is root only where the box has a user namespace of its own
        (runc): root elsewhere, or a user the image lacks, is SandboxUserUnsupportedError. Output past Inspect's limit kills the command: OutputLimitExceededError.
        `concurrency` counts the command against Inspect's `max_subprocesses`, as it runs a process here.
        """
        data = input.encode() if isinstance(input, str) else input
        options = {"cwd": self._path(cwd) if cwd is not None else None, "env": env or None, "user": user}
        limit = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
        for attempt in range(START_RETRIES + 1):
            run = ExecRun(limit)
            try:
                if concurrency:
                    async with inspect_concurrency("subprocesses", max_subprocesses_context_var.get(), resizable=True):
                        code = await self._wait(run, cmd, data, timeout, options)
                else:
                    code = await self._wait(run, cmd, data, timeout, options)
                break
            except GrantError as exc:
                if user is None:
                    raise
                raise SandboxUserUnsupportedError(str(exc)) from exc
            except EngineError as exc:
                if self._sandbox.returncode is not None:
                    raise self._unavailable() from exc
                if not (timeout_retry and attempt < START_RETRIES):
                    raise SandboxUnavailableError(f"quinebox could not start the command in box {self._sandbox.id}: {exc}") from exc
            except QuineboxError as exc:
                if self._sandbox.returncode is not None:
                    raise self._unavailable() from exc
                raise
        if run.over:
            raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR, run.output())
        if run.timed_out:
            error = TimeoutError(f"Command timed out after {timeout} seconds")
            setattr(error, "truncated_output", run.output())  # noqa: B010 what Inspect shows the model of a command cut short; TimeoutError declares no such attribute
            raise error
        stdout, stderr = bytes(run.stdout).decode(errors="replace"), bytes(run.stderr).decode(errors="replace")
        if code != 0 and self._sandbox.returncode is not None:
            raise self._unavailable()
        if code == 126 and not stdout and len(stderr.strip().splitlines()) == 1 and "permission denied" in stderr.lower():
            raise PermissionError(errno.EACCES, f"Permission denied executing {shlex.join(cmd)}: {stderr.strip()}", cmd[0])
        return ExecResult(success=code == 0, returncode=code, stdout=stdout, stderr=stderr)

    async def _wait(self, run: ExecRun, cmd: list[str], data: bytes | None, timeout: int | None, options: dict[str, Any]) -> int:
        """`run` in a thread, killed if the caller is cancelled meanwhile."""
        return await self._killed_if_cancelled(run, self._exec, run, cmd, data, timeout, options)

    @staticmethod
    async def _killed_if_cancelled(run: ExecRun, call: Callable[..., T], *args: Any) -> T:
        """`call` in a thread; if the caller is cancelled meanwhile, `run`'s command is killed before it goes on."""
        try:
            return await in_thread(call, *args, abandon_on_cancel=True)
        except anyio.get_cancelled_exc_class():
            run.kill()
            raise

    def _exec(self, run: ExecRun, cmd: list[str], data: bytes | None, timeout: int | None, options: dict[str, Any]) -> int:
        # Sandbox.exec's steps, with a bounded sink for the output: then a revision of /world if the command changed it
        code = run.run(self._sandbox, list(cmd), input=data, timeout=timeout, **options)
        if self._sandbox.returncode is None:  # a box that ended has no world left to revise
            self._sandbox.world.commit("exec", command=shlex.join(cmd))
        return code

    def _unavailable(self) -> SandboxUnavailableError:
        return SandboxUnavailableError(
            f"the sandbox is not running: quinebox box {self._sandbox.id} ended ({self._sandbox.diagnostics().strip() or 'its TTL ran out, or it was removed'})"
        )

    def _path(self, path: str) -> str:
        """A path in the box; a relative one is the working directory's (the per-sample filesystem context)."""
        return posixpath.join(self._sandbox.workdir, path)

    # -- files ---------------------------------------------------------------------------------

    async def write_file(self, file: str, contents: str | bytes) -> None:
        """`contents` into `file` as the box's user, its missing parents made; replaced whole."""
        try:
            await in_thread(self._sandbox.write_file, self._path(file), contents, timeout=FILE_TIMEOUT)
        except (FileNotFoundError, IsADirectoryError, PermissionError, NotADirectoryError) as exc:
            raise os_error(type(exc), file) from exc
        except shutil.SpecialFileError as exc:  # a FIFO, a socket, a device: of Inspect's documented errors, this one
            raise PermissionError(errno.EACCES, str(exc), file) from exc
        except QuineboxError as exc:
            if self._sandbox.returncode is not None:
                raise self._unavailable() from exc
            raise

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> str | bytes:
        """`file`'s bytes as the box's user reads them (text: strict UTF-8, newlines kept), no more than Inspect's
        read limit of them: past it the read is stopped and OutputLimitExceededError raised (at once when the file's
        size says so). A FIFO, a socket or a device there is PermissionError saying which: it has no bytes to read."""
        data = await in_thread(self._read, file, abandon_on_cancel=True)  # the read ends by its own cap and deadline
        return data.decode("utf-8") if text else data

    def _read(self, file: str) -> bytes:
        try:
            return self._sandbox.read_file(self._path(file), max_bytes=SandboxEnvironmentLimits.MAX_READ_FILE_SIZE, timeout=FILE_TIMEOUT)
        except FileTooLargeError as exc:
            raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, None) from exc
        except (FileNotFoundError, IsADirectoryError, PermissionError, NotADirectoryError) as exc:
            raise os_error(type(exc), file) from exc
        except shutil.SpecialFileError as exc:  # a FIFO, a socket, a device: of Inspect's documented errors, this one
            raise PermissionError(errno.EACCES, str(exc), file) from exc
        except TimeoutError as exc:
            raise TimeoutError(f"reading {file} took longer than {FILE_TIMEOUT} seconds") from exc
        except QuineboxError as exc:
            if self._sandbox.returncode is not None:
                raise self._unavailable() from exc
            raise

    # -- people --------------------------------------------------------------------------------

    async def connection(self, *, user: str | None = None) -> SandboxConnection:
        """The command a person pastes into a shell (as the same user, on this machine) to look inside the box."""
        if self._sandbox.returncode is not None:
            raise ConnectionError(f"quinebox box {self._sandbox.id} is not running")
        command = Sandbox.connection_command(self._sandbox.id)
        if user is not None:
            command = shlex.join(["quinebox", "exec", "--in", self._sandbox.id, "-it", "--user", user, "--", "sh"])
        return SandboxConnection(type="quinebox", command=command, container=self._sandbox.id)

    def default_polling_interval(self) -> float:
        return 0.2  # an exec costs milliseconds, as docker's does


def remove_boxes(id: str | None) -> list[str]:
    """Remove box `id` (its id, prefix or name), or all of this provider's, then collect orphans; the sessions removed.
    A box that did not go stays, as `quinebox box rm` leaves it, and is not among those named."""
    doomed = [Sandbox.connect(id)] if id is not None else [sb for sb in Sandbox.running() if (sb.name or "").startswith(NAME_PREFIX)]
    removed = []
    for sandbox in doomed:  # as `quinebox box rm` does
        try:
            sandbox.destroy()
        except QuineboxError:
            continue
        removed.append(sandbox.id)
    return removed + Sandbox.collect_garbage()

"""`quinebox.Sandbox`: a box that lasts while many commands run in it and its files are read and written.

What other people's agents need (an Inspect AI eval, an MCP client, a test suite): the same hardened box as
`quinebox.exec`'s — grants, policy, egress, secrets, approvals, audit — made once, its grants fixed then, and
any number of execs in it, each with the five channels of its own. The friendly layer over box.process (the
box, whose main process only waits), box.execs (one command in it) and box.sandboxes (its record and files).

    with quinebox.Sandbox(grants=["mem:512m"]) as sb:
        sb.write_file("/world/x.py", "print(6 * 7)")
        print(sb.exec(["python3", "/world/x.py"]).stdout)      # b'42\\n'
"""

from __future__ import annotations

import asyncio
import functools
import io
import shlex
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import IO, TYPE_CHECKING, Any

from quinebox.api import ExecResult
from quinebox.audit import log
from quinebox.box.live import checkpoints, freezing, owner_exec, sandboxes, snapshots
from quinebox.box.live.controls import Controls
from quinebox.box.live.execs import BoxExec, Target
from quinebox.box.live.snapshots import Snapshot
from quinebox.box.net.init_line import InitLine
from quinebox.box.policy import GUEST_PYTHON
from quinebox.box.process import BoxProcess
from quinebox.box.spec import BoxSpec, build_spec
from quinebox.box.streams.direct import DEVNULL, PIPE, Stream
from quinebox.errors import QuineboxError
from quinebox.processes import owner_id
from quinebox.sandbox_time import SandboxTime
from quinebox.tree.supervisor import Node

if TYPE_CHECKING:
    from quinebox.box.backends.docker import DockerBackend

#: A long-lived box's main process: it waits, and the box lasts as long as it does.
HOLD = (*GUEST_PYTHON, "-c", "import signal\nsignal.pause()")
#: How long a box's init may take to say, once started, that it runs execs (gVisor's Python takes longest).
INIT_TIMEOUT = 10.0


class SandboxWorld:
    """A long-lived box's /world and its revisions: one after each exec that changed it, as an agent's after each sh call."""

    def __init__(self, sandbox: Sandbox):
        self._sandbox = sandbox
        self.session = sandbox.id

    def commit(self, note: str = "commit", *, command: str | None = None) -> dict[str, Any] | None:
        """A revision now if the world changed since the newest (its record), else None; `command`: what changed it,
        as `quinebox world log` shows (a caller that runs execs its own way, through Popen, says which)."""
        world = self._sandbox._box.world
        if world is None:
            raise QuineboxError(f"box {self.session} has no world of its own to revise (it was made with --world DIR)")
        with self._sandbox._revising:
            return world.revise(note, command=command)

    def log(self) -> list[dict[str, Any]]:
        from quinebox.worlds.revisions import RevisionLog

        return RevisionLog(self.session).records()

    def diff(self, rev: int | None = None, against: int | None = None) -> str:
        """What `quinebox world diff ID [REV] [--against REV]` prints."""
        from quinebox.worlds import history

        out = io.StringIO()
        history.print_diff(self.session, rev, against, out=out)
        return out.getvalue()

    def export(self, out: IO[bytes], rev: int | None = None) -> list[str]:
        """A revision (default: the newest) as a tar archive on `out`; the paths whose bytes were not kept."""
        from quinebox.worlds import history

        return history.export(self.session, rev, out)


class Sandbox(SandboxTime):
    """A hardened box that lasts until `close()` (or the end of a `with` block, its `ttl`, or this process).

    Options are `quinebox.exec`'s, fixed when the box is made; `backend` ("oci", "docker") and `runtime`
    ("runc", "runsc") choose where it runs, as --backend and --runtime do. `name` is what `quinebox box ls`
    shows and `quinebox exec --in NAME` takes. Pausing, snapshots and forks: sandbox_time.py.
    """

    def __init__(
        self,
        *,
        image: str | None = None,
        grants: Iterable[str] = (),
        policy: str | None = None,
        workdir: str | None = None,
        world: str | None = None,
        world_from: str | Sequence[str] | None = None,
        world_tar: str | None = None,
        pull: str = "missing",
        ask: Iterable[str] = (),
        deny: Iterable[str] = (),
        ask_timeout: float | str | None = None,
        backend: str | None = None,
        runtime: str | None = None,
        ttl: float | str | None = None,
        name: str | None = None,
        docker: DockerBackend | None = None,
        _holder: bool = False,
        _idle: float | None = None,
        _spec: BoxSpec | None = None,
    ):
        """`_spec`: the box's spec made already (a copy of a snapshot's box: `restore`)."""
        spec = _spec or build_spec(
            HOLD, grants=grants, policy=policy, timeout=ttl, image=image, workdir=workdir, world=world, world_from=world_from,
            world_tar=world_tar, pull=pull, ask=ask, deny=deny, ask_timeout=ask_timeout, backend=backend, runtime=runtime,
        )
        self.id = spec.session
        self.name = name
        self._diagnostics: list[bytes] = []
        self._closed = False
        self._revising = threading.Lock()  # one revision of the world at a time: execs may run concurrently
        self._line: InitLine | None = None  # the box's init, once asked (`_line_asked`)
        self._line_asked = False
        self._asking_line = threading.Lock()
        self._box = BoxProcess(spec, stdin=DEVNULL, stdout=DEVNULL, stderr=self._diagnostics.append, backend=docker, place=Node.root(spec), lasting=True)
        choice = self._box.choice
        docker = getattr(self._box, "_backend", None) if choice.engine else None
        try:
            where = choice.backend if choice.engine else choice.runtime or "runc"
            record = sandboxes.Record(
                self.id, self._box.id or "", where, owner_id(), time.time(), name=name, holder=_holder,
                ttl=self._box.spec.grants.time, idle=_idle,
            )
            sandboxes.write_record(record)
            self._record = record
            self.target: Target = sandboxes.target(record, engine=docker)
            self._execs: weakref.WeakSet[BoxExec] = weakref.WeakSet()
            # The box's owner answers its user's other processes: pause, checkpoint, fork; and `exec --in`, run here as
            # this process's own execs (started by the box's init, which only the lifeline's holder can ask).
            self._controls = Controls(self.id, self._control, handoff=functools.partial(owner_exec.serve, session=self.id, popen=self.Popen))
        except BaseException:
            self._box.kill()
            self._box.wait()
            raise

    @classmethod
    def restore(cls, snapshot: str | Snapshot, *, ttl: float | str | None = None, name: str | None = None, _checked: bool = False,
                _holder: bool = False, _idle: float | None = None) -> Sandbox:
        """A new live box from a snapshot (its id, a unique start of it, or the Snapshot `checkpoint` returned): a
        new id, a copy of the snapshot's world, the same image and grants, its processes going on from where the
        snapshot's were. Another user's snapshot, or one changed since it was made, is refused (QuineboxError)."""
        made = snapshot if isinstance(snapshot, Snapshot) and _checked else snapshots.find(snapshot if isinstance(snapshot, str) else snapshot.id)
        if not _checked:
            snapshots.verify(made)
        copy = cls(_spec=checkpoints.copy_spec(made, HOLD, ttl=ttl), name=name, _holder=_holder, _idle=_idle)
        try:
            checkpoints.redial(copy.target.box, copy._box.broker)
        except BaseException:
            copy.close()
            raise
        log.note("box_restored", copy.id, snapshot=made.id, box=made.box)
        return copy

    @property
    def world(self) -> SandboxWorld:
        return SandboxWorld(self)

    @property
    def workdir(self) -> str:
        """Where an exec runs when it names no cwd, and what a relative path is relative to."""
        return self.target.cwd

    @property
    def returncode(self) -> int | None:
        """None while the box runs; once it has ended (closed, TTL, killed), how."""
        return self._box.poll()

    @staticmethod
    def connection_command(ref: str) -> str:
        """What a person runs to look inside a long-lived box, from any shell of the same user."""
        return f"quinebox exec --in {shlex.quote(ref)} -it -- sh"

    def _alive(self) -> None:
        if self._closed or self._box.poll() is not None:
            why = "it was closed" if self._closed else "it ended (its TTL ran out, or it was removed)"
            raise QuineboxError(f"box {self.id} is not running: {why}")

    def _ready(self) -> None:
        """Where this Sandbox's execs start (Popen, read_file, write_file): the box runs, and is not paused."""
        self._alive()
        freezing.refuse_if_paused(self.id)

    def Popen(
        self,
        argv: Sequence[str],
        *,
        stdin: Stream | bytes = None,
        stdout: Stream = None,
        stderr: Stream = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
    ) -> BoxExec:
        """One command in the box, its streams like subprocess.Popen's; `kill()` ends its whole process tree."""
        self._ready()
        environ = [f"{k}={v}" for k, v in (env or {}).items()]
        bad = [k for k in (env or {}) if not k or "=" in k or "\0" in k]
        if bad:
            raise QuineboxError(f"bad environment variable name {bad[0]!r}: a name has no '=' and no NUL")
        proc = BoxExec(self._exec_target(), list(argv), stdin=stdin, stdout=stdout, stderr=stderr, cwd=cwd, env=environ, user=sandboxes.user_of(self.target, user))
        self._execs.add(proc)  # a checkpoint waits for none to run
        return proc

    def _exec_target(self) -> Target:
        """The box, with its init's line once the init has said it serves execs (the first exec waits for its
        hello, which comes as the box starts): this process holds the lifeline, so execs start there."""
        with self._asking_line:
            if not self._line_asked:
                self._line, self._line_asked = self._box.init_line(INIT_TIMEOUT), True
        return replace(self.target, line=self._line)

    def exec(
        self,
        argv: Sequence[str],
        *,
        input: bytes | str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
        timeout: float | None = None,
    ) -> ExecResult:
        """Run `argv` in the box and collect its output. When `timeout` runs out the exec's whole process tree is
        killed, the box stays up, and the result says 124 and timed_out rather than raise."""
        began = time.monotonic()
        data = input.encode() if isinstance(input, str) else input
        proc = self.Popen(argv, stdin=data if data is not None else DEVNULL, stdout=PIPE, stderr=PIPE, cwd=cwd, env=env, user=user)
        out, err = proc.communicate(timeout)
        code = proc.wait()
        self._revise(argv)
        return ExecResult(
            argv=proc.args, returncode=code, stdout=out, stderr=err, timed_out=proc.timed_out,
            oom_killed=False, session=self.id, duration_s=time.monotonic() - began,
        )

    def _revise(self, argv: Sequence[str]) -> None:
        """A revision of the world if the exec changed it: what `sb.world.log()` and `quinebox world log` show."""
        if self._box.world is not None:
            self.world.commit("exec", command=shlex.join(argv))

    def read_file(self, path: str, *, max_bytes: int = sandboxes.READ_MAX, timeout: float = sandboxes.FILE_TIMEOUT) -> bytes:
        """A file's bytes, as the box's user may read it: FileNotFoundError, IsADirectoryError, PermissionError.

        The box may have made `path` anything, so the read is bounded: a FIFO, a socket or a device is
        shutil.SpecialFileError, a file of more than `max_bytes` (default 256 MiB) FileTooLargeError, a read
        longer than `timeout` seconds TimeoutError — each at once or by its bound, and the box stays up."""
        self._ready()
        return sandboxes.read_bytes(self.target, path, max_bytes=max_bytes, timeout=timeout)

    def write_file(self, path: str, data: bytes | str, *, timeout: float = sandboxes.FILE_TIMEOUT) -> None:
        """`data` (str as UTF-8) into a file of the box, its missing parent directories made, replaced whole;
        shutil.SpecialFileError if the box made `path` a FIFO, a socket or a device."""
        self._ready()
        sandboxes.write_bytes(self.target, path, data.encode() if isinstance(data, str) else data, timeout=timeout)
        self._revise(["write_file", path])

    def diagnostics(self) -> str:
        """What the host said about the box (egress refused, a world full, its end)."""
        return b"".join(self._diagnostics).decode(errors="replace")

    def close(self) -> None:
        """Remove the box and everything running in it; a second close does nothing."""
        if self._closed:
            return
        self._closed = True
        self._controls.close()
        try:
            if freezing.pause_of(self.id) is not None and self._box.poll() is None:  # a frozen process dies only once thawed
                freezing.thaw(self.target.box)
            self._box.kill()
            self._box.wait()
        finally:
            sandboxes.remove_record(self.id)

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the box to end (its TTL, `quinebox box rm`, or this process); how it ended."""
        code = self._box.wait(timeout)
        sandboxes.remove_record(self.id)
        return code

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- async twins (and sandbox_time.py's) -----------------------------------------------------

    async def aexec(self, argv: Sequence[str], **options: Any) -> ExecResult:
        return await self._in_thread(self.exec, argv, **options)

    async def aread_file(self, path: str, **options: Any) -> bytes:
        return await self._in_thread(self.read_file, path, **options)

    async def awrite_file(self, path: str, data: bytes | str, **options: Any) -> None:
        await self._in_thread(self.write_file, path, data, **options)

    async def aclose(self) -> None:
        await self._in_thread(self.close)

    @classmethod
    async def acreate(cls, **options: Any) -> Sandbox:
        """`Sandbox(**options)` without blocking the event loop while the box starts."""
        return await asyncio.get_running_loop().run_in_executor(None, functools.partial(cls, **options))

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

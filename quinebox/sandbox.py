"""`quinebox.Sandbox`: a box that lasts while many commands run in it and its files are read and written.

What other people's agents need (an Inspect AI eval, an MCP client, a test suite): the same hardened box as
`quinebox.exec`'s — grants, policy, egress, secrets, approvals, audit — made once, its grants fixed then, and
any number of execs in it, each with the five channels of its own. The friendly layer over box.process (the
box, whose main process only waits), box.execs (one command in it) and box.sandboxes (its record and files).

    with quinebox.Sandbox(grants=["mem:512m"]) as sb:
        sb.write_file("/world/x.py", "print(6 * 7)")
        print(sb.exec(["python3", "/world/x.py"]).stdout)      # b'42\\n'

A Sandbox owns its box (it ends with `close()` or this process), or is attached to one that another process owns:
`Sandbox.connect(ID)` (a box of `quinebox box create`'s, or another process's Sandbox), `Sandbox.detached(...)` (a
box made with a holder process of its own, box/live/holders.py). An attached Sandbox's execs are handed to the box's
owner (box/live/handed.py), its pause and checkpoint asked of it; its `close()` only lets go, `destroy()` ends
the box. Files beyond read and write (list, stat, remove, mkdir, tars and directories in and out) are
box/live/box_files.py's, each bounded as a read is.
"""

from __future__ import annotations

import functools
import json
import shlex
import sys
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from quinebox.api import ExecResult
from quinebox.audit import log
from quinebox.box.live import capped, checkpoints, freezing, holders, owner_exec, sandboxes, snapshots
from quinebox.box.live.controls import Controls
from quinebox.box.live.execs import BoxExec, Target
from quinebox.box.live.handed import HandedExec
from quinebox.box.live.snapshots import Snapshot
from quinebox.box.net.init_line import InitLine
from quinebox.box.owners import listing
from quinebox.box.policy import GUEST_PYTHON
from quinebox.box.process import BoxProcess
from quinebox.box.spec import BoxSpec, build_spec
from quinebox.box.streams.direct import DEVNULL, Stream
from quinebox.errors import QuineboxError
from quinebox.grants import parse_duration
from quinebox.processes import owner_alive, owner_id
from quinebox.sandbox_files import SandboxFiles
from quinebox.sandbox_time import SandboxTime
from quinebox.tree.supervisor import Node

if TYPE_CHECKING:
    from quinebox.box.backends.docker import DockerBackend

#: A long-lived box's main process: it waits, and the box lasts as long as it does.
HOLD = (*GUEST_PYTHON, "-c", "import signal\nsignal.pause()")
#: How long a box's init may take to say, once started, that it runs execs (gVisor's Python takes longest).
INIT_TIMEOUT = 10.0
#: How long `destroy` waits for an attached box to go (its owner removes it; on a loaded machine that takes seconds).
GONE_WITHIN = 30.0
#: What `exec` keeps of each of stdout and stderr unless its caller says otherwise; the rest is dropped.
MAX_OUTPUT = 64 << 20
#: How long a detached box lasts with no exec running in it, unless `idle=` says otherwise (as `box create`'s).
DETACHED_IDLE = "1h"
#: What a spawned holder's launcher runs (box/live/holders.py's `spawn`).
HOLDER_CODE = "import sys\nfrom quinebox.sandbox import hold_spawned\nhold_spawned(int(sys.argv[1]))"
#: The exit status an attached Sandbox gives a box that ended (its owner knows how; it was removed, or timed out).
EXIT_GONE = 137


class Sandbox(SandboxFiles, SandboxTime):
    """A hardened box that lasts until `close()` (or the end of a `with` block, its `ttl`, or this process).

    Options are `quinebox.exec`'s, fixed when the box is made; `backend` ("oci", "docker") and `runtime`
    ("runc", "runsc") choose where it runs, as --backend and --runtime do. `name` is what `quinebox box ls`
    shows and `quinebox exec --in NAME` takes. Files: sandbox_files.py; pausing, snapshots and forks: sandbox_time.py.
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
        self._controls: Controls | None = None
        self._box: BoxProcess | None = (box := BoxProcess(spec, stdin=DEVNULL, stdout=DEVNULL, stderr=self._diagnostics.append, backend=docker, place=Node.root(spec), lasting=True))
        choice = box.choice
        docker = getattr(box, "_backend", None) if choice.engine else None
        try:
            where = choice.backend if choice.engine else choice.runtime or "runc"
            record = sandboxes.Record(
                self.id, box.id or "", where, owner_id(), time.time(), name=name, holder=_holder, ttl=box.spec.grants.time, idle=_idle,
            )
            sandboxes.write_record(record)
            self._record = record
            self.target: Target = sandboxes.target(record, engine=docker)
            self._execs: weakref.WeakSet[BoxExec] = weakref.WeakSet()
            # The box's owner answers its user's other processes: pause, checkpoint, fork; and `exec --in`, run here as
            # this process's own execs (started by the box's init, which only the lifeline's holder can ask).
            self._controls = Controls(self.id, self._control, handoff=functools.partial(owner_exec.serve, session=self.id, popen=self._popen_here))
        except BaseException:
            box.kill()
            box.wait()
            raise

    # -- attached: a box another process owns ---------------------------------------------------

    @classmethod
    def connect(cls, ref: str) -> Sandbox:
        """This Sandbox attached to a living long-lived box of this user's, by its id (or a unique start of it) or its
        name, as `quinebox exec --in` takes them: one of `quinebox box create`, of `Sandbox.detached`, or another
        process's Sandbox. Its execs are run by the box's owner; `close()` lets go of it, `destroy()` ends it."""
        return cls._attach(sandboxes.find(ref)[0])

    @classmethod
    def running(cls) -> list[Sandbox]:
        """Each living long-lived box of this user's (what `quinebox box ls` lists), attached."""
        return [cls._attach(record) for record, _ in sandboxes.live()]

    @staticmethod
    def collect_garbage() -> list[str]:
        """Remove every box whose owner is gone (one a crashed process left), as `quinebox gc` does; their ids."""
        from quinebox.box.owners import gc

        return gc.collect_garbage()

    @classmethod
    def _attach(cls, record: sandboxes.Record) -> Sandbox:
        self = cls.__new__(cls)
        self.id, self.name = record.session, record.name
        self._diagnostics, self._closed, self._revising = [], False, threading.Lock()
        self._line, self._line_asked, self._asking_line = None, True, threading.Lock()
        self._controls, self._box, self._record = None, None, record
        self.target = sandboxes.target(record)
        self._execs = weakref.WeakSet()
        return self

    @classmethod
    def detached(cls, *, idle: float | str | None = DETACHED_IDLE, **options: Any) -> Sandbox:
        """A box that outlives this process, made as `Sandbox(**options)` makes one but owned by a holder process of
        its own (as `quinebox box create`'s): it lasts until `destroy()` (or `quinebox box rm`), its `ttl`, or `idle`
        with no exec running in it (None: never); with `snapshot=ID` (and `ttl`, `name`), a copy of a snapshot's box, as
        `quinebox box restore` makes. Returned attached (`connect`); any process of this user may attach."""
        if "docker" in options:
            raise QuineboxError("a detached box's holder makes it with an engine client of its own: drop docker=")
        options.update({k: list(v) for k, v in options.items() if k in ("grants", "ask", "deny") or k == "world_from" and isinstance(v, (list, tuple))})
        seconds = parse_duration(str(idle)) if idle not in (None, 0, "0", "") else None
        payload = json.dumps({"options": options, "idle": seconds}).encode()
        return cls.connect(holders.told(holders.spawn(HOLDER_CODE, payload)))

    @property
    def attached(self) -> bool:
        """Whether another process owns the box (`connect`, `detached`): then `close()` only lets go of it."""
        return self._box is None

    def _gone(self) -> bool:
        """An attached box has ended: its record is gone (removed with it), or its owner is (the box went with it)."""
        return not (sandboxes.records_dir() / f"{self.id}.json").exists() or not owner_alive(self._record.owner)

    # -- the box --------------------------------------------------------------------------------

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
            checkpoints.redial(copy.target.box, copy._owned.broker)
        except BaseException:
            copy.close()
            raise
        log.note("box_restored", copy.id, snapshot=made.id, box=made.box)
        return copy

    @property
    def _owned(self) -> BoxProcess:
        if self._box is None:
            raise QuineboxError(f"box {self.id} is owned by another process: this Sandbox is attached to it")
        return self._box

    @property
    def workdir(self) -> str:
        """Where an exec runs when it names no cwd, and what a relative path is relative to."""
        return self.target.cwd

    @property
    def returncode(self) -> int | None:
        """None while the box runs; once it has ended (closed, TTL, killed), how (an attached Sandbox says 137)."""
        if self._box is None:
            return EXIT_GONE if self._gone() else None
        return self._box.poll()

    @staticmethod
    def connection_command(ref: str) -> str:
        """What a person runs to look inside a long-lived box, from any shell of the same user."""
        return f"quinebox exec --in {shlex.quote(ref)} -it -- sh"

    def _alive(self) -> None:
        if self._closed or self.returncode is not None:
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
    ) -> BoxExec | HandedExec:
        """One command in the box, its streams like subprocess.Popen's; `kill()` ends its whole process tree. In an
        attached Sandbox the box's owner starts it (as `quinebox exec --in` has it), or, where no owner answers (a
        box of an older quinebox), the box's backend, its tree killed should this process die first."""
        if self._box is not None:
            return self._popen_here(argv, stdin=stdin, stdout=stdout, stderr=stderr, cwd=cwd, env=env, user=user)
        self._ready()
        environ = _environ(env)
        handed = HandedExec.start(self.id, argv, stdin=stdin, stdout=stdout, stderr=stderr, cwd=cwd, env=environ, user=user)
        if handed is not None:
            return handed
        return BoxExec(self.target, list(argv), stdin=stdin, stdout=stdout, stderr=stderr, cwd=cwd, env=environ, user=sandboxes.user_of(self.target, user), guard=True)

    def _popen_here(
        self, argv: Sequence[str], *, stdin: Stream | bytes = None, stdout: Stream = None, stderr: Stream = None,
        cwd: str | None = None, env: Mapping[str, str] | None = None, user: str | None = None,
    ) -> BoxExec:
        """An exec this process starts through the box's init, as its owner (and for `exec --in`'s of others)."""
        self._ready()
        environ = _environ(env)
        proc = BoxExec(self._exec_target(), list(argv), stdin=stdin, stdout=stdout, stderr=stderr, cwd=cwd, env=environ, user=sandboxes.user_of(self.target, user))
        self._execs.add(proc)  # a checkpoint waits for none to run
        return proc

    def _exec_target(self) -> Target:
        """The box, with its init's line once the init has said it serves execs (the first exec waits for its
        hello, which comes as the box starts): this process holds the lifeline, so execs start there."""
        with self._asking_line:
            if not self._line_asked:
                self._line, self._line_asked = self._owned.init_line(INIT_TIMEOUT), True
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
        max_output: int = MAX_OUTPUT,
    ) -> ExecResult:
        """Run `argv` in the box and collect its output. When `timeout` runs out the exec's whole process tree is
        killed, the box stays up, and the result says 124 and timed_out rather than raise. Of each of stdout and
        stderr `max_output` bytes are kept (default 64 MiB); the rest is read and dropped, the command goes on, and
        the result says `truncated`."""
        began = time.monotonic()
        data = input.encode() if isinstance(input, str) else input
        out, err = capped.Kept(max_output), capped.Kept(max_output)
        proc = self._started(self.Popen(argv, stdin=data if data is not None else DEVNULL, stdout=out, stderr=err, cwd=cwd, env=env, user=user))  # a cancelled aexec kills it (sandbox_time.py)
        code = proc.wait_drained(timeout)
        self._revise(argv)
        return ExecResult(
            argv=proc.args, returncode=code, stdout=out.bytes(), stderr=err.bytes(), timed_out=proc.timed_out,
            oom_killed=False, session=self.id, duration_s=time.monotonic() - began, truncated=out.truncated or err.truncated,
        )

    def diagnostics(self) -> str:
        """What the host said about the box (egress refused, a world full, its end); an attached Sandbox hears none."""
        return b"".join(self._diagnostics).decode(errors="replace")

    def close(self) -> None:
        """Remove the box and everything running in it (an attached Sandbox only lets go: the box goes on); a second
        close does nothing."""
        if self._closed:
            return
        self._closed = True
        if self._box is None:
            return
        if self._controls is not None:
            self._controls.close()
        try:
            if freezing.pause_of(self.id) is not None and self._box.poll() is None:  # a frozen process dies only once thawed
                freezing.thaw(self.target.box)
            self._box.kill()
            if not sys.is_finalizing():  # at the interpreter's exit (a __del__, atexit) the threads a wait needs are gone:
                self._box.wait()  # the box goes with this process all the same (its lifeline), and the keeper removes it
        finally:
            sandboxes.remove_record(self.id)

    def destroy(self) -> None:
        """End the box and everything running in it, owned or attached (as `quinebox box rm`); QuineboxError if it
        would not go in time. A box that has ended already is left as it is."""
        if self._box is not None:
            self.close()
            return
        self._closed = True
        if self._gone():
            return
        try:  # its owner removes it the one way every box is removed (a holder then exits): no listing to go wrong
            self._ask("destroy")
        except QuineboxError:  # no owner answers (gone, or of an older quinebox): killed as `quinebox box rm` does
            listing.kill_subtree(self.id)
        if not sandboxes.wait_gone(self.id, GONE_WITHIN):  # one that stays keeps its record: `box ls` still shows it
            raise QuineboxError(f"box {self.id} did not go in time: `quinebox gc` removes it once its runtime answers")
        sandboxes.remove_record(self.id)

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the box to end (its TTL, `quinebox box rm`, or this process); how it ended."""
        if self._box is None:
            deadline = None if timeout is None else time.monotonic() + timeout
            while (code := self.returncode) is None:
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"box {self.id} still runs after {timeout:g} s")
                time.sleep(0.1)
            return code
        code = self._box.wait(timeout)
        sandboxes.remove_record(self.id)
        return code

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- async twins (the rest: sandbox_time.py, sandbox_files.py) -----------------------------------------------------

    async def aexec(self, argv: Sequence[str], **options: Any) -> ExecResult:
        return await self._in_thread(self.exec, argv, **options)

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _environ(env: Mapping[str, str] | None) -> list[str]:
    bad = [k for k in (env or {}) if not k or "=" in k or "\0" in k]
    if bad:
        raise QuineboxError(f"bad environment variable name {bad[0]!r}: a name has no '=' and no NUL")
    return [f"{k}={v}" for k, v in (env or {}).items()]


def held(options: dict[str, Any], idle: float | None) -> Sandbox:
    """What a holder makes and owns (holders.py): a Sandbox of `options`, or a copy of a snapshot's box (`snapshot`)."""
    if "snapshot" in options:
        return Sandbox.restore(options["snapshot"], ttl=options.get("ttl"), name=options.get("name"), _checked=options.get("checked", False), _holder=True, _idle=idle)
    return Sandbox(**options, _holder=True, _idle=idle)


def hold_spawned(report: int) -> None:
    """A spawned holder's launcher (HOLDER_CODE): its box's options on stdin, its report on fd `report`."""
    said = json.loads(sys.stdin.buffer.read())
    holders.launched(functools.partial(held, said["options"], said["idle"]), said["idle"], report)

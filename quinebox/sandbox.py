"""`quinebox.Sandbox`: a box that lasts while many commands run in it and its files are read and written.

What other people's agents need (an Inspect AI eval, an MCP client, a test suite): the same hardened box as
`quinebox.exec`'s — grants, policy, egress, secrets, approvals, audit — made once, its grants fixed then, and
any number of execs in it, each with the five channels of its own. The friendly layer over box.process (the
box, whose main process only waits), box/live/execs.py (one command in it) and box/live/sandboxes.py (its record).

    with quinebox.Sandbox(grants=["mem:512m"]) as sb:
        sb.write_file("/world/x.py", "print(6 * 7)")
        print(sb.exec(["python3", "/world/x.py"]).stdout)      # b'42\\n'

A Sandbox owns its box (it ends with `close()` or this process), or is attached to one that another process owns:
`Sandbox.connect(ID)` (a box of `quinebox box create`'s, or another process's Sandbox), `Sandbox.detached(...)` (a
box made with a holder process of its own, box/live/holders.py). An attached Sandbox's execs are handed to the box's
owner (box/live/handed.py), its pause and checkpoint asked of it; its `close()` only lets go, `destroy()` ends
the box.

Its files: each path reached by an exec of the guest's files.py in the box as the box's user (or the `user=` each
takes), bounded (box/live/box_files.py): a byte cap, a deadline, nothing the box planted (a FIFO, a socket, a
device, a link out) hanging the host or being followed. A directory coming out of the box is the box's work,
unpacked here as untrusted (untar.py). In an attached box each counts as the box in use.

    sb.mkdir("/world/src"); sb.put_dir("src", "/world/src")
    [f.name for f in sb.listdir("/world/src")]        # FileInfo(name, path, type, size, mode, mtime) each
    sb.get_dir("/world/out", "out", max_bytes=100 << 20)

Its time, over box/live/freezing.py (pause, the markers every process reads), checkpoints.py (a snapshot taken
on gVisor, a copy's spec) and snapshots.py (where snapshots lie, sealed). The box's owner does each of them —
only it runs the box's clocks and waits for its init — so a Sandbox also answers them for the user's other
processes (controls.py: `quinebox box pause ID` and the rest).

    sb.pause(); sb.resume()                      # every process stopped, then on; the TTL and idle clocks stand still
    snap = sb.checkpoint()                       # memory, processes, open files, tmpfs and /world, at one instant
    copy = quinebox.Sandbox.restore(snap)        # a new live box from it (a new id), and the original goes on
    copies = sb.fork(4)                          # four copies, each from the same instant, each with its own world
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import io
import json
import os
import shlex
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import IO, TYPE_CHECKING, Any

from quinebox import untar
from quinebox.api import ExecResult
from quinebox.audit import log
from quinebox.box.live import box_files, capped, checkpoints, controls, freezing, holders, owner_exec, sandboxes, snapshots
from quinebox.box.live.box_files import FileInfo
from quinebox.box.live.checkpoints import Live
from quinebox.box.live.controls import Controls
from quinebox.box.live.execs import BoxExec, Target
from quinebox.box.live.handed import HandedExec
from quinebox.box.live.snapshots import Snapshot
from quinebox.box.net.init_line import InitLine
from quinebox.box.options import BoxOptions
from quinebox.box.owners import listing
from quinebox.box.policy import GUEST_PYTHON
from quinebox.box.process import BoxProcess
from quinebox.box.spec import BoxSpec, build_spec
from quinebox.box.streams.direct import DEVNULL, Stream
from quinebox.errors import QuineboxError
from quinebox.grants import parse_duration
from quinebox.processes import owner_alive, owner_id, signal_owner
from quinebox.tree.supervisor import Node

if TYPE_CHECKING:
    from quinebox.box.backends.docker.engine import DockerBackend

#: A long-lived box's main process: it waits, and the box lasts as long as it does.
HOLD = (*GUEST_PYTHON, "-c", "import signal\nsignal.pause()")
#: How long a box's init may take to say, once started, that it runs execs (gVisor's Python takes longest).
INIT_TIMEOUT = 10.0
#: How long `destroy` waits for an attached box's owner to take its request, and then for the box to go by the
#: owner's hand (on a loaded machine that takes seconds) before it helps: a holder told to stop, the box killed.
OWNER_ANSWERS_WITHIN = 10.0
OWNER_REMOVES_WITHIN = 10.0
#: How long `destroy` then waits for the box to go.
GONE_WITHIN = 30.0
#: What `exec` keeps of each of stdout and stderr unless its caller says otherwise; the rest is dropped.
MAX_OUTPUT = 64 << 20
#: How long a detached box lasts with no exec running in it, unless `idle=` says otherwise (as `box create`'s).
DETACHED_IDLE = "1h"
#: What a spawned holder's launcher runs (box/live/holders.py's `spawn`).
HOLDER_CODE = "import sys\nfrom quinebox.sandbox import hold_spawned\nhold_spawned(int(sys.argv[1]))"
#: The exit status an attached Sandbox gives a box that ended (its owner knows how; it was removed, or timed out).
EXIT_GONE = 137
#: The most copies one fork makes.
MAX_FORK = 64
#: The threads the async twins run on: quinebox's own, made as they are needed, not the event loop's default executor
#: (min(32, cpus + 4) threads, which as many long `aexec`s fill, stalling every other call of the loop and its getaddrinfo).
THREADS = ThreadPoolExecutor(max_workers=64, thread_name_prefix="quinebox-async")


class Sandbox:
    """A hardened box that lasts until `close()` (or the end of a `with` block, its `ttl`, or this process).

    The box is `options` (a BoxOptions), or the options given by name (`grants=`, `image=`, `backend=`,
    `runtime=`, …: the fields of BoxOptions, another name a TypeError), or `options` with those given by name
    replacing its own, fixed when the box is made; its time limit is `ttl` (BoxOptions' `timeout`). `name` is
    what `quinebox box ls` shows and `quinebox exec --in NAME` takes; `docker`, a connection to the engine to use.
    """

    def __init__(
        self,
        options: BoxOptions | None = None,
        *,
        ttl: float | str | None = None,
        name: str | None = None,
        docker: DockerBackend | None = None,
        _holder: bool = False,
        _idle: float | None = None,
        _spec: BoxSpec | None = None,
        **given: Any,
    ):
        """`_spec`: the box's spec made already (a copy of a snapshot's box: `restore`)."""
        spec = _spec or build_spec(HOLD, box_options(options, given, ttl))
        self.id = spec.session
        self.name = name
        self._diagnostics: list[bytes] = []
        self._closed = False
        self._revising = threading.Lock()  # one revision of the world at a time: execs may run concurrently
        self._line: InitLine | None = None  # the box's init, once asked (`_line_asked`)
        self._line_asked = False
        self._asking_line = threading.Lock()
        self._controls: Controls | None = None
        box = BoxProcess(
            spec, stdin=DEVNULL, stdout=DEVNULL, stderr=self._diagnostics.append, backend=docker, place=Node.root(spec), lasting=True,
        )
        self._box: BoxProcess | None = box
        docker = box._backend  # the engine's client, for a box on the engine (None on another backend)
        try:
            record = sandboxes.Record(
                self.id, box.id or "", box.choice.where, owner_id(), time.time(), name=name, holder=_holder, ttl=box.spec.grants.time, idle=_idle,
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
    def detached(cls, options: BoxOptions | None = None, *, idle: float | str | None = DETACHED_IDLE, **given: Any) -> Sandbox:
        """A box that outlives this process, made as `Sandbox(options, **given)` makes one but owned by a holder
        process of its own (as `quinebox box create`'s): it lasts until `destroy()` (or `quinebox box rm`), its `ttl`,
        or `idle` with no exec running in it (None: never); with `snapshot=ID` (and `ttl`, `name`), a copy of a
        snapshot's box, as `quinebox box restore` makes. Returned attached (`connect`); any process of this user may
        attach. An unknown option is a TypeError here, before any holder starts."""
        if "docker" in given:
            raise QuineboxError("a detached box's holder makes it with an engine client of its own: drop docker=")
        own: dict[str, Any] = {key: given.pop(key) for key in ("ttl", "name", "snapshot") if key in given}
        if "snapshot" in own:
            if options is not None or given:
                raise TypeError(f"a copy of a snapshot's box takes only ttl= and name=, not {', '.join(given) or 'options'}")
            said = own
        else:
            said = {**box_options(options, given).given(), **own}  # names checked here; the holder builds them again
        seconds = parse_duration(str(idle)) if idle not in (None, 0, "0", "") else None
        payload = json.dumps({"options": said, "idle": seconds}).encode()
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
        check: bool = False,
    ) -> ExecResult:
        """Run `argv` in the box and collect its output. When `timeout` runs out the exec's whole process tree is
        killed, the box stays up, and the result says 124 and timed_out rather than raise. Of each of stdout and
        stderr `max_output` bytes are kept (default 64 MiB); the rest is read and dropped, the command goes on, and
        the result says `truncated`. `check`: a status other than 0 raises subprocess.CalledProcessError (its
        args, returncode, output and stderr), as subprocess.run(check=True) does."""
        began = time.monotonic()
        data = input.encode() if isinstance(input, str) else input
        out, err = capped.Kept(max_output), capped.Kept(max_output)
        stdin = data if data is not None else DEVNULL
        proc = self.Popen(argv, stdin=stdin, stdout=out, stderr=err, cwd=cwd, env=env, user=user)
        self._started(proc)  # a cancelled aexec kills it (_Call)
        code = proc.wait_drained(timeout)
        self._revise(argv)
        result = ExecResult(
            args=proc.args, returncode=code, stdout=out.bytes(), stderr=err.bytes(), timed_out=proc.timed_out,
            oom_killed=False, session=self.id, duration_s=time.monotonic() - began, truncated=out.truncated or err.truncated,
        )
        if check:
            result.check_returncode()
        return result

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
            controls.ask(self.id, {"op": "destroy"}, OWNER_ANSWERS_WITHIN)
            gone = sandboxes.wait_gone(self.id, OWNER_REMOVES_WITHIN)
        except QuineboxError:  # no owner answers (gone, stopped, or of an older quinebox)
            gone = False
        if not gone:  # a holder is told to stop (its own way out removes the box), and the box killed as `box rm` does
            if self._record.holder:
                signal_owner(self._record.owner, signal.SIGTERM)
            listing.kill_subtree(self.id)
            gone = sandboxes.wait_gone(self.id, GONE_WITHIN)
        if not gone:  # one that stays keeps its record: `box ls` still shows it
            raise QuineboxError(f"box {self.id} did not go in time: `quinebox gc` removes it once its runtime answers")
        sandboxes.remove_record(self.id)

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the box to end (its TTL, `quinebox box rm`, or this process); how it ended.
        subprocess.TimeoutExpired once `timeout` passes, the box left running, as its main process's wait says."""
        if self._box is None:
            deadline = None if timeout is None else time.monotonic() + timeout
            while (code := self.returncode) is None:
                if deadline is not None and time.monotonic() >= deadline:
                    raise subprocess.TimeoutExpired(HOLD, timeout or 0)
                time.sleep(0.1)
            return code
        code = self._box.wait(timeout)
        sandboxes.remove_record(self.id)
        return code

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- files ----------------------------------------------------------------------------------

    @property
    def world(self) -> SandboxWorld:
        return SandboxWorld(self)

    def _revise(self, argv: Sequence[str]) -> None:
        """A revision of the world if the exec changed it: what `sb.world.log()` and `quinebox world log` show."""
        if self._box is not None and self._box.world is not None:
            self.world.commit("exec", command=shlex.join(argv))

    def _files(self, call: Callable[..., Any], path: str, *args: Any, user: str | None = None, **options: Any) -> Any:
        """`call(target, path, ...)` as `user` (default the box's; "root" where the box's root is no one outside, as for
        exec), the box running and not paused; in an attached box, counted as in use (a holder's idle limit waits)."""
        self._ready()
        if self._box is not None:  # the owner: through the box's init, the fast way
            return call(self._exec_target(), path, *args, user=sandboxes.user_of(self.target, user), **options)
        with sandboxes.Running(self.id):  # its owner starts them, as it does its own execs (and says who `user` is)
            return call(box_files.Via(self.target, self.Popen), path, *args, user=user, **options)

    def read_file(self, path: str, *, max_bytes: int = box_files.READ_MAX, timeout: float = box_files.FILE_TIMEOUT, user: str | None = None) -> bytes:
        """A file's bytes, as the box's user may read it: FileNotFoundError, IsADirectoryError, PermissionError.

        The box may have made `path` anything, so the read is bounded: a FIFO, a socket or a device is
        shutil.SpecialFileError, a file of more than `max_bytes` (default 256 MiB) FileTooLargeError, a read
        longer than `timeout` seconds TimeoutError — each at once or by its bound, and the box stays up."""
        return self._files(box_files.read_bytes, path, max_bytes=max_bytes, timeout=timeout, user=user)

    def write_file(self, path: str, data: bytes | str, *, timeout: float = box_files.FILE_TIMEOUT, user: str | None = None) -> None:
        """`data` (str as UTF-8) into a file of the box, its missing parent directories made, replaced whole;
        shutil.SpecialFileError if the box made `path` a FIFO, a socket or a device."""
        self._files(box_files.write_bytes, path, data.encode() if isinstance(data, str) else data, timeout=timeout, user=user)
        self._revise(["write_file", path])

    def listdir(self, path: str = ".", *, max_bytes: int = box_files.READ_MAX, timeout: float = box_files.FILE_TIMEOUT, user: str | None = None) -> list[FileInfo]:
        """What a directory of the box holds, by name (links as links); FileTooLargeError past `max_bytes` of listing."""
        return self._files(box_files.listdir, path, max_bytes=max_bytes, timeout=timeout, user=user)

    def stat(self, path: str, *, follow_symlinks: bool = False, timeout: float = box_files.FILE_TIMEOUT, user: str | None = None) -> FileInfo:
        """What `path` is in the box: a link itself, unless `follow_symlinks`."""
        return self._files(box_files.stat, path, follow_symlinks=follow_symlinks, timeout=timeout, user=user)

    def remove(self, path: str, *, recursive: bool = False, timeout: float = box_files.FILE_TIMEOUT, user: str | None = None) -> None:
        """Remove a file or link of the box; a directory with everything in it when `recursive` (never through a
        link), else IsADirectoryError. (The box itself ends with `destroy()`.)"""
        self._files(box_files.remove, path, recursive=recursive, timeout=timeout, user=user)
        self._revise(["remove", path])

    def mkdir(self, path: str, *, parents: bool = True, exist_ok: bool = True, timeout: float = box_files.FILE_TIMEOUT, user: str | None = None) -> None:
        """Make a directory in the box (with its missing parents); FileExistsError unless `exist_ok`."""
        self._files(box_files.mkdir, path, parents=parents, exist_ok=exist_ok, timeout=timeout, user=user)

    def put_tar(self, path: str, fileobj: IO[bytes], *, max_bytes: int = box_files.TAR_MAX, timeout: float = box_files.TAR_TIMEOUT, user: str | None = None) -> None:
        """Unpack the tar read from `fileobj` into directory `path` of the box (made if missing), as the box's user:
        no member outside `path`, nothing through a link, no device or FIFO, modes as tarfile's `data` filter gives;
        a refused archive is QuineboxError naming the member, and nothing of it is written."""
        self._files(box_files.put_tar, path, fileobj, max_bytes=max_bytes, timeout=timeout, user=user)
        self._revise(["put_tar", path])

    def get_tar(self, path: str, fileobj: IO[bytes], *, max_bytes: int = box_files.TAR_MAX, timeout: float = box_files.TAR_TIMEOUT, user: str | None = None) -> None:
        """A tar of `path` onto `fileobj`: a file as one member of its name, a directory's contents by their paths in
        it; links as links, FIFOs, sockets and devices left out. FileTooLargeError past `max_bytes` (default 1 GiB).
        It is the box's work: unpack it as untrusted (`get_dir` does)."""
        self._files(box_files.get_tar, path, fileobj, max_bytes=max_bytes, timeout=timeout, user=user)

    def put_dir(
        self, local_dir: str | os.PathLike[str], path: str, *, max_bytes: int = box_files.TAR_MAX, timeout: float = box_files.TAR_TIMEOUT, user: str | None = None,
    ) -> None:
        """A directory of this machine's copied into directory `path` of the box (its contents; links as links, an
        absolute or outward one refused; FIFOs, sockets and devices left out); FileTooLargeError past `max_bytes` of
        tar (default 1 GiB)."""
        if not os.path.isdir(local_dir):
            raise NotADirectoryError(20, "Not a directory", str(local_dir))
        read_end, write_end = os.pipe()
        failed: list[BaseException] = []
        thread = threading.Thread(target=_tar_of, args=(os.fspath(local_dir), write_end, failed), daemon=True)
        thread.start()
        try:
            with os.fdopen(read_end, "rb") as stream:
                self.put_tar(path, stream, max_bytes=max_bytes, timeout=timeout, user=user)
        finally:
            thread.join(timeout)
        if failed:
            raise failed[0]

    def get_dir(self, path: str, local_dir: str | os.PathLike[str], *, max_bytes: int = box_files.TAR_MAX, timeout: float = box_files.TAR_TIMEOUT, user: str | None = None) -> None:
        """What `path` of the box holds, into `local_dir` here (made if missing), unpacked as untrusted (untar.py:
        nothing through a link, nothing outside `local_dir`, no device or FIFO; a refused archive is QuineboxError)."""
        os.makedirs(local_dir, exist_ok=True)
        with tempfile.NamedTemporaryFile(prefix="quinebox-get-", suffix=".tar") as spool:
            self.get_tar(path, spool, max_bytes=max_bytes, timeout=timeout, user=user)
            spool.flush()
            try:
                untar.unpack(spool.name, local_dir, max_members=box_files.MAX_MEMBERS, max_bytes=max_bytes)
            except (untar.Refused, untar.Unreadable) as exc:
                raise QuineboxError(f"refused what box {self.id} gave for {path}: {exc}") from None

    # -- time: pause, resume, checkpoint, fork ------------------------------------------------------

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

    def fork(self, n: int) -> list[Sandbox]:
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
        return sandboxes.busy(self.id) or any(proc.returncode is None and proc.poll() is None for proc in list(self._execs))

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

    # -- async twins ------------------------------------------------------------------------------

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

    async def aexec(self, argv: Sequence[str], **options: Any) -> ExecResult:
        return await self._in_thread(self.exec, argv, **options)

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._in_thread(self.close)

    async def adestroy(self) -> None:
        await self._in_thread(self.destroy)

    @classmethod
    async def acreate(cls, **options: Any) -> Sandbox:
        """`Sandbox(**options)` without blocking the event loop while the box starts."""
        return await asyncio.get_running_loop().run_in_executor(THREADS, functools.partial(cls, **options))

    @classmethod
    async def aconnect(cls, ref: str) -> Sandbox:
        return await asyncio.get_running_loop().run_in_executor(THREADS, cls.connect, ref)

    @classmethod
    async def adetached(cls, **options: Any) -> Sandbox:
        return await asyncio.get_running_loop().run_in_executor(THREADS, functools.partial(cls.detached, **options))

    async def apause(self) -> None:
        await self._in_thread(self.pause)

    async def aresume(self) -> None:
        await self._in_thread(self.resume)

    async def acheckpoint(self) -> Snapshot:
        return await self._in_thread(self.checkpoint)

    async def afork(self, n: int) -> list[Sandbox]:
        return await self._in_thread(self.fork, n)

    @classmethod
    async def arestore(cls, snapshot: str | Snapshot, **options: Any) -> Sandbox:
        """`Sandbox.restore(snapshot, **options)` without blocking the event loop."""
        return await asyncio.get_running_loop().run_in_executor(THREADS, functools.partial(cls.restore, snapshot, **options))

    async def aread_file(self, path: str, **options: Any) -> bytes:
        return await self._in_thread(self.read_file, path, **options)

    async def awrite_file(self, path: str, data: bytes | str, **options: Any) -> None:
        await self._in_thread(self.write_file, path, data, **options)

    async def alistdir(self, path: str = ".", **options: Any) -> list[FileInfo]:
        return await self._in_thread(self.listdir, path, **options)

    async def astat(self, path: str, **options: Any) -> FileInfo:
        return await self._in_thread(self.stat, path, **options)

    async def aremove(self, path: str, **options: Any) -> None:
        await self._in_thread(self.remove, path, **options)

    async def amkdir(self, path: str, **options: Any) -> None:
        await self._in_thread(self.mkdir, path, **options)

    async def aput_tar(self, path: str, fileobj: IO[bytes], **options: Any) -> None:
        await self._in_thread(self.put_tar, path, fileobj, **options)

    async def aget_tar(self, path: str, fileobj: IO[bytes], **options: Any) -> None:
        await self._in_thread(self.get_tar, path, fileobj, **options)

    async def aput_dir(self, local_dir: str | os.PathLike[str], path: str, **options: Any) -> None:
        await self._in_thread(self.put_dir, local_dir, path, **options)

    async def aget_dir(self, path: str, local_dir: str | os.PathLike[str], **options: Any) -> None:
        await self._in_thread(self.get_dir, path, local_dir, **options)


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

def box_options(options: BoxOptions | None, given: dict[str, Any], ttl: float | str | None = None) -> BoxOptions:
    """A Sandbox's box: `options` with those `given` by name (an unknown name is BoxOptions' TypeError), its time
    limit `ttl`."""
    if "timeout" in given:
        raise TypeError("a Sandbox's time limit is ttl=, not timeout= (an exec's own is exec(..., timeout=))")
    box = BoxOptions.of(options, **given)
    return replace(box, timeout=ttl) if ttl is not None else box


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


class SandboxWorld:
    """A long-lived box's /world and its revisions: one after each exec that changed it, as an agent's after each sh call."""

    def __init__(self, sandbox: Sandbox):
        self._sandbox = sandbox
        self.session = sandbox.id

    def commit(self, note: str = "commit", *, command: str | None = None) -> dict[str, Any] | None:
        """A revision now if the world changed since the newest (its record), else None; `command`: what changed it,
        as `quinebox world log` shows (a caller that runs execs its own way, through Popen, says which)."""
        if self._sandbox._box is None:
            raise QuineboxError(f"box {self.session}'s world is revised by its owner: this Sandbox is attached to it")
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


def _tar_of(local_dir: str, fd: int, failed: list[BaseException]) -> None:
    """`local_dir`'s contents as a tar stream on `fd` (links as links; FIFOs, sockets and devices left out)."""
    def kept(item: tarfile.TarInfo) -> tarfile.TarInfo | None:
        return item if item.isreg() or item.isdir() or item.issym() or item.islnk() else None

    try:
        with os.fdopen(fd, "wb") as out, tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for name in sorted(os.listdir(local_dir)):
                tar.add(os.path.join(local_dir, name), arcname=name, filter=kept)
    except BrokenPipeError:
        pass  # the box stopped reading: what it said is what counts
    except BaseException as exc:  # noqa: BLE001 raised again in the caller's thread
        failed.append(exc)

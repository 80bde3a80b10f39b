"""A command run in a live box beside its main process, whichever backend the box is on; and entering a box.

An exec's timeout, its `kill` and the death of whoever waits for it must end every process the command
started — one that calls setsid() or forks twice included — and leave the box up. So each exec gets a pids
cgroup of its own below its box's, and nothing inside a box can leave a cgroup (it sees no cgroupfs it may
write): killing what that cgroup lists ends the exec's whole tree and nothing else. How each backend starts
one and places it there is its Way (exec_ways.py); what it looks like from here, subprocess.Popen's surface,
is the same for all.

Entering a box (`quinebox enter`) is one such exec, with this process's stdin, stdout and stderr, as the box's
user and within its limits: only whoever started the box may. Left-over processes of an exec that ended by
itself (a server started in the background) keep running, as under `docker exec`; they go with their box.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, Self

from quinebox.box.backends.boxes import Box
from quinebox.box.live.exec_ways import EXIT_KILLED, Way, way_for
from quinebox.box.net.init_line import InitLine
from quinebox.box.owners.listing import BoxInfo, live_boxes
from quinebox.box.streams import relay
from quinebox.box.streams.direct import DirectStdio, Stream
from quinebox.errors import GrantError, QuineboxError

if TYPE_CHECKING:
    from quinebox.box.backends.docker.engine import DockerBackend

#: A timeout reports 124, as timeout(1) does.
EXIT_TIMEOUT = 124
#: How long the outputs of a killed exec may take to end (every process that held them is gone by then).
KILLED_GRACE = 10.0
#: How long `terminate` gives a process after its SIGTERM before it is killed, as `docker stop` gives a container.
TERMINATE_GRACE = 10.0


class Process(ABC):
    """subprocess.Popen's meaning, one for a box's main process (box/process.py's BoxProcess, `quinebox.Popen`)
    and for a command in a lasting box (BoxExec, and HandedExec's in a box another process owns: `Sandbox.Popen`).

    `wait(timeout)` and `communicate(timeout=)` raise subprocess.TimeoutExpired and leave it running (a second
    `communicate` goes on reading where the first stopped); `terminate` is SIGTERM, then SIGKILL once
    TERMINATE_GRACE seconds have passed with it still running; `kill` is SIGKILL, at once; `pid` is the host's
    view of it, or None where the host has none (gVisor's kernel holds the process). A timeout that kills is
    `wait_drained`'s (`Sandbox.exec`'s meaning: 124, `timed_out`), not `wait`'s.
    """

    args: tuple[str, ...]
    returncode: int | None
    stdin: Any
    stdout: IO[bytes] | None
    stderr: IO[bytes] | None
    _talk: _Talk | None = None

    @property
    @abstractmethod
    def pid(self) -> int | None: ...

    @abstractmethod
    def poll(self) -> int | None: ...

    @abstractmethod
    def wait(self, timeout: float | None = None) -> int:
        """Its exit status once it has ended; subprocess.TimeoutExpired once `timeout` passes, and it runs on."""

    @abstractmethod
    def send_signal(self, sig: int) -> None:
        """`sig` to the process (nothing once it has ended)."""

    @abstractmethod
    def kill(self) -> None: ...

    def terminate(self) -> None:
        """SIGTERM, then SIGKILL once TERMINATE_GRACE seconds have passed with it still running; returns at once."""
        if self.poll() is not None:
            return
        self.send_signal(signal.SIGTERM)
        timer = threading.Timer(TERMINATE_GRACE, self._kill_if_running)
        timer.daemon = True
        timer.start()

    def _kill_if_running(self) -> None:
        if self.poll() is None:
            self.kill()

    def communicate(self, input: bytes | None = None, timeout: float | None = None) -> tuple[bytes | None, bytes | None]:
        """`input` written to its PIPEd stdin (then closed), its PIPEd stdout and stderr read to their end, then
        waited for: (stdout, stderr), None for a stream that is not a PIPE. subprocess.TimeoutExpired (with what
        was read so far) once `timeout` passes; it runs on, and a second call goes on from there."""
        if self._talk is None:
            self._talk = _Talk(self, input)
        elif input:
            raise ValueError("cannot send input after starting communication")
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._talk.join(deadline):
            raise subprocess.TimeoutExpired(self.args, timeout or 0, output=self._talk.got("out"), stderr=self._talk.got("err"))
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return self._talk.got("out"), self._talk.got("err")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        for stream in (self.stdout, self.stderr):
            if stream is not None and self._talk is None:
                stream.close()
        if self.stdin:
            self.stdin.close()
        self.wait()


class _Talk:
    """One `communicate`'s threads — one feeds stdin, one reads each output — and what they have read, kept for a
    second `communicate` after a timeout, as subprocess keeps them."""

    def __init__(self, proc: Process, input: bytes | None):
        self._parts: dict[str, list[bytes]] = {}
        self._threads: list[threading.Thread] = []
        if proc.stdin is not None:
            self._thread(_feed, proc.stdin, input)
        for name, stream in (("out", proc.stdout), ("err", proc.stderr)):
            if stream is not None:
                self._parts[name] = []
                self._thread(_read, stream, self._parts[name])

    def _thread(self, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name="quinebox-communicate", daemon=True)
        thread.start()
        self._threads.append(thread)

    def join(self, deadline: float | None) -> bool:
        """Whether every stream has come to its end (by `deadline`)."""
        for thread in self._threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self._threads)

    def got(self, name: str) -> bytes | None:
        parts = self._parts.get(name)
        return None if parts is None else b"".join(parts)


def _feed(stdin: Any, data: bytes | None) -> None:
    try:
        if data:
            stdin.write(data)
            stdin.flush()
    except (BrokenPipeError, ConnectionResetError):
        pass  # it stopped reading: what it read is what counts, as subprocess has it
    finally:
        try:
            stdin.close()
        except OSError:
            pass


def _read(stream: IO[bytes], parts: list[bytes]) -> None:
    read = getattr(stream, "read1", stream.read)
    try:
        while chunk := read(relay.CHUNK):
            parts.append(chunk)
    finally:
        stream.close()


@dataclass(frozen=True)
class Target:
    """What an exec needs to know of its box: the box, and its main process's user and directory; `line`, the
    box's init over its lifeline, where this process holds it (the box's owner): execs start fastest there."""

    session: str
    box: Box
    user: str
    cwd: str
    line: InitLine | None = None

    @property
    def backend(self) -> str:
        return self.box.backend


def target_of(session: str, box: Box) -> Target:
    """A live box's exec target: its main process's user and working directory, as its backend says them."""
    user, cwd = box.process()
    return Target(session, box, user, cwd)


class BoxExec(Process):
    """One command running in a live box, its streams connected like subprocess.Popen's (direct.DirectStdio's)."""

    def __init__(
        self,
        target: Target,
        argv: Sequence[str],
        *,
        stdin: Stream | bytes = None,
        stdout: Stream = None,
        stderr: Stream = None,
        cwd: str | None = None,
        env: Sequence[str] = (),
        user: str | None = None,
        tty: bool = False,
        guard: bool = False,
    ):
        """`tty`: the command gets a terminal (this process's size, set before it runs -- under gVisor just after; on the engine
        its output is then one stream, on stdout). `guard`: a forked watchdog kills the exec's tree if this
        process dies before the exec ends (for a CLI process, whose box is owned by another)."""
        if not argv:
            raise GrantError("nothing to run: give a command, as in `quinebox exec --in ID -- CMD [ARGS...]`")
        self.target = target
        self.args = tuple(argv)
        self.returncode: int | None = None
        self.timed_out = False
        self._killed = False
        self._lock = threading.Lock()
        self._pid: int | None = None
        user = user or target.user
        line = target.line if user == target.user else None  # the init runs execs as itself only
        self._way: Way = way_for(target.box, target.session, tty=tty, guard=guard, line=line)
        self._stdio = stdio = DirectStdio(stdin, stdout, stderr, copy_files=self._way.copy_files)
        self.stdin, self.stdout, self.stderr = stdio.stdin, stdio.stdout, stdio.stderr
        cwd = os.path.join(target.cwd, cwd) if cwd else target.cwd  # a relative cwd is the box's working directory's
        try:
            self._way.start(argv, cwd, env, user, stdio.fds)
        except BaseException:
            stdio.close()
            if self._way.cgroup is not None:
                self._way.cgroup.kill()
                self._way.cgroup.remove()
            raise
        stdio.started()
        stdio.box_gone()  # the host says nothing into an exec's stderr: so its end is the command's alone
        self._pid = self._root()  # known now where the way placed it itself, before it has children of its own

    # -- subprocess.Popen's surface (Process) --------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The command's process id as the host sees it: the first of its exec's cgroup, whose parent is outside
        it (the box's init, or the runtime's); None under gVisor (no host process) or once it has ended."""
        until = time.monotonic() + KILLED_GRACE
        while self._pid is None and self._way.cgroup is not None and self.returncode is None:
            self._pid = self._root()
            if self._pid is None and (self._way.ended(0.01) or time.monotonic() > until):  # a runtime's exec joins its cgroup as it starts
                break
        return self._pid

    def _root(self) -> int | None:
        cgroup = self._way.cgroup
        pids = set(cgroup.pids()) if cgroup is not None else set()
        roots = [pid for pid in pids if _parent(pid) not in pids]
        return min(roots, key=_started_at) if roots else None

    def send_signal(self, sig: int) -> None:
        """`sig` to the command's own process, while it runs (its tree: `kill`); QuineboxError under gVisor, whose
        processes the host cannot signal one by one (`kill` ends the command there)."""
        pid = self.pid
        if pid is None:
            if self.returncode is None and self._way.cgroup is None:
                raise QuineboxError(f"a command in box {self.target.session} on gVisor cannot be signalled from the host: kill() ends it")
            return
        cgroup = self._way.cgroup
        if cgroup is not None and pid in cgroup.pids():  # still its process, not a reused pid
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """SIGKILL the exec's whole process tree; the box stays up."""
        self._killed = True
        if self._way.cgroup is not None:
            self._way.cgroup.kill()
        else:
            self._way.kill_untracked()

    def resize(self, rows: int, cols: int) -> None:
        """The command's terminal takes this size (on the engine; a runtime follows this terminal itself)."""
        self._way.resize(rows, cols)

    def poll(self) -> int | None:
        if self.returncode is None and self._way.ended(0):
            return self.wait()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the command to end (and its outputs to be drained, for a few seconds more at most); its exit
        status. subprocess.TimeoutExpired once `timeout` passes, the command left running. A process it left
        holding its outputs is left be, as subprocess's wait leaves it."""
        if self.returncode is None and not self._ended(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self._settle(None)

    def wait_drained(self, timeout: float | None = None) -> int:
        """`Sandbox.exec`'s wait: when `timeout` runs out the exec's tree is killed and this says 124 (`timed_out`),
        rather than raise, and the timeout covers the outputs read to their end too, as subprocess.run's does: a
        command that leaves a process holding them (`sleep 60 & echo started`) is 124 by the deadline."""
        if self.returncode is not None:
            return self.returncode
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._ended(timeout):
            self.timed_out = True
            self.kill()
            self._way.ended(KILLED_GRACE)
        return self._settle(deadline)

    def _ended(self, timeout: float | None) -> bool:
        """Whether the command has ended (within `timeout`); any exception here (KeyboardInterrupt) kills its tree."""
        try:
            return self._way.ended(timeout)
        except BaseException:
            self.kill()
            raise

    def _settle(self, deadline: float | None) -> int:
        with self._lock:
            if self.returncode is None:
                self.returncode = self._finish(deadline)
        return self.returncode

    def _finish(self, deadline: float | None = None) -> int:
        code = self._way.status()
        self._stdio.box_gone()  # its copy of stderr, for the host's diagnostics: the drain ends once it is closed too
        left = KILLED_GRACE if deadline is None or self.timed_out else max(0.0, deadline - time.monotonic())
        if not self._stdio.finish(left) and deadline is not None and not self.timed_out:
            # The command ended, but what it started still holds its outputs past the deadline (`sleep 60 &`): the
            # timeout is the whole exec's, as subprocess.run's covers reading to the end, so its tree is killed.
            self.timed_out = True
            self.kill()
            self._stdio.finish(KILLED_GRACE)
        cgroup, guard = self._way.cgroup, self._way.watchdog
        if cgroup is not None:
            if self.timed_out or self._killed:
                cgroup.kill()
            cgroup.remove()
        if guard is not None:  # the exec ended while we lived: the watchdog leaves what it left running
            os.write(guard, b"x")
            os.close(guard)
        if self.timed_out:
            return EXIT_TIMEOUT
        return EXIT_KILLED if self._killed and code != 0 else code

    def busy(self) -> bool:
        """Does anything the exec started still run (in its cgroup)?"""
        return self._way.cgroup.busy() if self._way.cgroup is not None else self.returncode is None


def _parent(pid: int) -> int:
    try:
        return int(_stat(pid)[1])
    except (OSError, IndexError, ValueError):
        return 0


def _started_at(pid: int) -> int:
    try:
        return int(_stat(pid)[19])
    except (OSError, IndexError, ValueError):
        return 0


def _stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command's name (state, ppid, …, starttime at 19)."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rpartition(")")[2].split()


def find_box(session: str, boxes: list[BoxInfo]) -> BoxInfo:
    """The one live box whose session starts with `session`, if the caller started it."""
    matches = [box for box in boxes if box.session.startswith(session)]
    if len(matches) != 1:
        raise QuineboxError(f"no live box {session!r} (or more than one starts so): `quinebox ps` lists them")
    box = matches[0]
    if box.user != str(os.getuid()):
        raise QuineboxError(f"box {box.session} was started by another user (uid {box.user or 'unknown'}): only its owner may enter it")
    return box


def enter_box(session: str, argv: list[str], *, tty: bool, backend: DockerBackend | None = None) -> BoxExec:
    """`argv` run in the live box `session` names, with this process's stdin, stdout and stderr; it ends with
    this process (SIGKILL included) or with the box, whichever comes first."""
    found = find_box(session, live_boxes(backend))
    assert found.box is not None
    return BoxExec(target_of(found.session, found.box), argv, tty=tty, guard=True)

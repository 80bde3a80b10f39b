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
import select
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from quinebox.box.backends.boxes import Box
from quinebox.box.live.exec_ways import EXIT_KILLED, Way, way_for
from quinebox.box.net.init_line import InitLine
from quinebox.box.owners.listing import BoxInfo, live_boxes
from quinebox.box.streams import relay
from quinebox.box.streams.direct import DirectStdio, Stream
from quinebox.errors import GrantError, QuineboxError

if TYPE_CHECKING:
    from quinebox.box.backends.docker import DockerBackend

#: A timeout reports 124, as timeout(1) does.
EXIT_TIMEOUT = 124
#: How long the outputs of a killed exec may take to end (every process that held them is gone by then).
KILLED_GRACE = 10.0


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


class BoxExec:
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

    # -- the subprocess-like surface ------------------------------------------------------------

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

    def communicate(self, timeout: float | None = None) -> tuple[bytes, bytes]:
        """Read the PIPEd stdout and stderr to their end in this thread, then wait, as Popen.communicate does; when
        `timeout` runs out the exec's tree is killed (so its outputs end) and `wait` says 124, rather than raise."""
        deadline = None if timeout is None else time.monotonic() + timeout
        outputs = [stream for stream in (self.stdout, self.stderr) if stream is not None]
        named = [stream.fileno() if stream is not None else -1 for stream in (self.stdout, self.stderr)]
        got: dict[int, list[bytes]] = {fd: [] for fd in named if fd >= 0}
        poller = select.poll()
        for fd in got:
            poller.register(fd, select.POLLIN)
        open_fds = set(got)
        try:
            while open_fds:
                if deadline is not None and time.monotonic() >= deadline:
                    if self.timed_out:
                        break  # the grace ran out too: what is left of the outputs is given up
                    self.timed_out = True
                    self.kill()
                    deadline = time.monotonic() + KILLED_GRACE  # every process that held them is gone by then
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                for fd, _ in poller.poll(None if left is None else left * 1000):
                    data = os.read(fd, relay.CHUNK)
                    if data:
                        got[fd].append(data)
                    else:
                        poller.unregister(fd)
                        open_fds.discard(fd)
        except BaseException:
            self.kill()
            raise
        finally:
            for stream in outputs:
                stream.close()
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        out, err = (b"".join(got.get(fd, [])) for fd in named)
        return out, err

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the command to end (and its outputs to be drained, for a few seconds more at most); its exit
        status, 124 after a timeout (`timeout` here kills the exec's tree when it runs out, as quinebox.exec's does,
        rather than raise). A process it left holding its outputs is left be, as subprocess's wait leaves it."""
        return self._wait(timeout, drained=False)

    def wait_drained(self, timeout: float | None = None) -> int:
        """`wait`, with `timeout` covering the outputs read to their end too, as subprocess.run's does: a command that
        leaves a process holding them (`sleep 60 & echo started`) is 124 by the deadline, its tree killed."""
        return self._wait(timeout, drained=True)

    def _wait(self, timeout: float | None, *, drained: bool) -> int:
        if self.returncode is not None:
            return self.returncode
        deadline = None if timeout is None or not drained else time.monotonic() + timeout
        try:
            if not self._way.ended(timeout):
                self.timed_out = True
                self.kill()
                self._way.ended(10)
        except BaseException:
            self.kill()
            raise
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

    def __enter__(self) -> BoxExec:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.stdin:
            self.stdin.close()
        self.wait()


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

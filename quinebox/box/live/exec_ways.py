"""How a command is started in a live box, behind the one BoxExec (execs.py): by the box's init, or by its backend.

- The box's init, where this process holds the box's lifeline (the box's owner: a Sandbox's process, `box
  create`'s holder): it forks the command in the box, already under every control of the box's; the host puts
  the child in a pids cgroup of its own before it runs anything (guest/execs.py). The fast way: a fork, not a
  runtime's start. Not under gVisor (its processes have no host pid or cgroup), nor with a terminal.
- Else the backend's own exec (Box.exec_way, in the backend's room): an OCI runtime's `exec` (oci/listed.py), or
  the engine's, placed in its cgroup before it runs (docker/box.py).

Each way is made, then started (`start`), so that what it made before a failure (its cgroup) is there to undo.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Sequence

from quinebox.box.backends.boxes import Box, Way
from quinebox.box.backends.exec_cgroups import EXIT_KILLED, ExecCgroup, cgroup_of, watchdog
from quinebox.box.net.init_line import InitLine
from quinebox.errors import EngineError
from quinebox.guest.execs import GO

#: What execs.py takes from here: the killed status, the way's type, and choosing one.
__all__ = ["EXIT_KILLED", "Way", "way_for"]
#: How long the init's child may take to say it is there (a fork, in a box that may be loaded).
START_TIMEOUT = 10.0
#: struct ucred: what SCM_CREDENTIALS carries (pid, uid, gid).
CREDENTIALS = struct.Struct("iII")


def way_for(box: Box, session: str, *, tty: bool, guard: bool, line: InitLine | None = None) -> Way:
    """The box's init when this process holds its lifeline (`line`) and the box's processes are the host's
    (not gVisor's: its kernel's pids are not the host's, so no cgroup can hold them), for a command with no
    terminal run as the box's own user; else the backend's own exec."""
    if line is not None and not tty and box.capabilities.host_processes:
        return InitWay(box, session, tty=tty, guard=guard, line=line)
    return box.exec_way(session, tty=tty, guard=guard)


class InitWay(Way):
    """Started by the box's init, which this process reaches over the box's lifeline (guest/execs.py): a fork
    of a process that is in the box already, with every control of the box's, placed in the exec's own cgroup
    before it runs anything; its stdin, stdout and stderr are the caller's own descriptors, as a runtime exec's are."""

    def __init__(self, box: Box, session: str, *, tty: bool, guard: bool, line: InitLine):
        super().__init__(box, session, tty=tty, guard=guard)
        self.line = line

    def start(self, argv: Sequence[str], cwd: str, env: Sequence[str], user: str, fds: tuple[int, int, int]) -> None:
        ours, theirs = socket.socketpair()
        try:
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)  # the child's pid, in the host's terms, from the kernel
            self._exited = self.line.start(argv, cwd, env, [*fds, theirs.fileno()])
            theirs.close()
            pid = _sender_pid(ours, START_TIMEOUT)
            if pid is None:
                return  # the init could not fork it (it says so, and why, on the command's stderr): its status comes
            self.cgroup = ExecCgroup(cgroup_of(pid))
            self.cgroup.add(pid)
            if self.guard:
                self.watchdog = watchdog(self.cgroup)
            ours.sendall(GO)
        finally:
            theirs.close()
            ours.close()

    def ended(self, timeout: float | None) -> bool:
        return self._exited.done.wait(timeout)

    def status(self) -> int:
        return self._exited.code


def _sender_pid(sock: socket.socket, timeout: float) -> int | None:
    """The host pid of the process that wrote to `sock` (SO_PASSCRED set on it): the kernel's word. None when
    the socket ended with nothing written: no child was forked to write it."""
    sock.settimeout(timeout)
    try:
        data, ancillary, _, _ = sock.recvmsg(1, socket.CMSG_SPACE(CREDENTIALS.size))
    except TimeoutError:
        raise EngineError("the command did not start in the box in time: the box may be out of memory or processes") from None
    if not data:
        return None
    for level, kind, blob in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            return int(CREDENTIALS.unpack(blob[: CREDENTIALS.size])[0])
    raise EngineError("the box's init gave no credentials for the command it started")

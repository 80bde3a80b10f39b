"""An exec in a long-lived box this process does not own, handed to the box's owner: an attached Sandbox's execs.

What `quinebox exec --in` does with its own stdin, stdout and stderr (owner_exec.py), done with streams like
subprocess.Popen's (direct.DirectStdio: PIPE, bytes, a callable, DEVNULL, an fd): their ends ride to the owner
over its control socket, the owner starts the command through the box's init as one of its own execs (in its own
cgroup, counted as the box in use), and no byte passes through the owner. The exit status comes back on the
connection; `kill` asks the owner to end the exec's tree, as does this process's going (SIGKILL included).
`start` says None when no owner answers (a box made by an older quinebox): the caller runs it the backend's way.
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import threading
from collections.abc import Sequence

from quinebox import fdpass
from quinebox.box.live.controls import control_path
from quinebox.box.live.execs import EXIT_TIMEOUT, KILLED_GRACE, Process
from quinebox.box.streams.direct import DirectStdio, Stream
from quinebox.errors import EXIT_QUINEBOX, GrantError, QuineboxError


class HandedExec(Process):
    """One command the box's owner runs for this process; the surface of BoxExec (execs.py). Its process is the
    owner's child, not this process's: `pid` is None, and a signal is asked of the owner."""

    def __init__(self, session: str, conn: socket.socket, stdio: DirectStdio, argv: Sequence[str]):
        self.session = session
        self.args = tuple(argv)
        self.returncode: int | None = None
        self.timed_out = False
        self._conn = conn
        self._stdio = stdio
        self.stdin, self.stdout, self.stderr = stdio.stdin, stdio.stdout, stdio.stderr
        self._lock = threading.Lock()

    @classmethod
    def start(
        cls, session: str, argv: Sequence[str], *, stdin: Stream | bytes = None, stdout: Stream = None, stderr: Stream = None,
        cwd: str | None = None, env: Sequence[str] = (), user: str | None = None,
    ) -> HandedExec | None:
        if not argv:
            raise GrantError("nothing to run: give a command, as in sb.exec(['sh', '-c', 'echo hi'])")
        conn = fdpass.connect(str(control_path(session)))
        if conn is None:
            return None
        stdio = DirectStdio(stdin, stdout, stderr)
        try:
            fdpass.send(conn, {"kind": "exec", "argv": list(argv), "cwd": cwd, "env": list(env), "user": user, "timeout": None}, stdio.fds)
        except BaseException:
            stdio.close()
            conn.close()
            raise
        stdio.started()  # the owner holds its copies now: EOF comes when the command closes them
        stdio.box_gone()
        return cls(session, conn, stdio, argv)

    @property
    def pid(self) -> None:
        return None

    def kill(self) -> None:
        """End the exec's whole process tree (the owner does); the box stays up."""
        self._tell({"kind": "kill"})

    def send_signal(self, sig: int) -> None:
        """`sig` to the command's process (the owner sends it)."""
        self._tell({"kind": "signal", "signal": int(sig)})

    def _tell(self, message: dict[str, object]) -> None:
        try:
            self._conn.sendall(json.dumps(message).encode() + b"\n")
        except OSError:
            pass  # it has ended, and its owner let go of the connection

    def poll(self) -> int | None:
        if self.returncode is None:
            ready = select.poll()  # not select.select: a process with many sandboxes has fds past 1023
            ready.register(self._conn, select.POLLIN)
            if ready.poll(0):
                return self.wait()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """The command's exit status; subprocess.TimeoutExpired once `timeout` passes, the command left running."""
        return self._wait(timeout, kill=False)

    def _wait(self, timeout: float | None, *, kill: bool) -> int:
        with self._lock:
            if self.returncode is not None:
                return self.returncode
            try:
                answer, fds = fdpass.receive(self._conn, timeout)
            except TimeoutError:
                if not kill:
                    raise subprocess.TimeoutExpired(self.args, timeout or 0) from None
                self.timed_out = True
                self.kill()
                try:
                    answer, fds = fdpass.receive(self._conn, KILLED_GRACE)
                except TimeoutError:
                    answer, fds = {"kind": "exit"}, []
            except BaseException:
                self.kill()
                raise
            for fd in fds:
                os.close(fd)
            self._conn.close()
            self._stdio.finish(KILLED_GRACE)
            if answer.get("kind") == "error":
                error = QuineboxError(str(answer.get("message") or "the box's owner could not start the command"))
                error.exit_code = int(answer.get("code") or EXIT_QUINEBOX)
                self.returncode = error.exit_code
                raise error
            if answer.get("kind") != "exit":
                self.returncode = EXIT_QUINEBOX
                raise QuineboxError(f"box {self.session}'s owner went away before the command ended (`quinebox box ls`)")
            self.returncode = EXIT_TIMEOUT if self.timed_out else int(answer.get("code", EXIT_QUINEBOX))
            return self.returncode

    def wait_drained(self, timeout: float | None = None) -> int:
        """`Sandbox.exec`'s wait: when `timeout` runs out the exec's tree is killed and this says 124 (`timed_out`),
        rather than raise. The owner runs the command and answers when it ends; a process it left holding the
        outputs is the owner's exec's to bound (its wait's grace), not this caller's deadline."""
        return self._wait(timeout, kill=True)

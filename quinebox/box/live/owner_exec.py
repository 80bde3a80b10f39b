"""An exec handed to the process that owns a long-lived box: how `quinebox exec --in` reaches the box's init.

Only the box's owner holds its lifeline, so only it can ask the box's init to start a command (execs.py's
fast way). `box create`'s holder listens on run/sandboxes/<session>.sock (0600, in a 0700 directory; only its
own uid is answered) for `exec --in` from any process of its user: one JSON line with the command, and the
caller's stdin, stdout and stderr (SCM_RIGHTS). The holder runs it as any exec of its own — in the exec's own
cgroup, its timeout killing the tree — with the caller's descriptors as the command's, so no byte passes
through the holder, and answers one line with the exit status. A caller that goes away (SIGKILL included)
ends its exec, as the watchdog of a runtime exec does; `{"kind": "kill"}` ends it early (the caller's signals).

A caller that finds no such socket (a box another quinebox made, or one with a terminal asked for) runs the
exec the backend's own way, as before.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from quinebox import fdpass
from quinebox.box.live import sandboxes
from quinebox.box.live.execs import BoxExec, Target
from quinebox.errors import QuineboxError

#: How long a caller may take to say what it wants once connected.
REQUEST_TIMEOUT = 5.0
#: The exit status of an exec the holder could not start for a reason of quinebox's own.
EXIT_QUINEBOX = 125


def socket_path(session: str) -> Path:
    return sandboxes.records_dir() / f"{session}.sock"


class OwnerExecs:
    """The owner's side: execs from other processes of its user, run in the box it holds."""

    def __init__(self, session: str, target: Callable[[], Target]):
        self.session = session
        self._target = target
        self._path = socket_path(session)
        sandboxes.records_dir(make=True)
        self._listener = fdpass.listen(str(self._path), mode=0o600, backlog=16)
        threading.Thread(target=self._accept, name=f"owner-execs:{session}", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            if fdpass.peer_uid(conn) != os.getuid():
                return
            try:
                request, fds = fdpass.receive(conn, REQUEST_TIMEOUT)
            except OSError:
                return
            try:
                code = self._run(conn, request, fds) if len(fds) == 3 else EXIT_QUINEBOX
            except QuineboxError as exc:
                _answer(conn, {"kind": "error", "code": exc.exit_code, "message": str(exc)})
                return
            finally:
                for fd in fds:
                    os.close(fd)
            _answer(conn, {"kind": "exit", "code": code})

    def _run(self, conn: socket.socket, request: dict[str, Any], fds: list[int]) -> int:
        argv, cwd, env, user, timeout = _checked(request)
        where = self._target()
        with sandboxes.Running(self.session):  # the caller's descriptors stay open here until the exec has ended:
            # under gVisor a regular file among them is written by a copier of ours (direct.py), not the box
            proc = BoxExec(where, argv, stdin=fds[0], stdout=fds[1], stderr=fds[2], cwd=cwd, env=env, user=sandboxes.user_of(where, user))
            threading.Thread(target=_follow, args=(conn, proc), daemon=True).start()
            return proc.wait(timeout)

    def close(self) -> None:
        self._listener.close()
        self._path.unlink(missing_ok=True)


def _checked(request: dict[str, Any]) -> tuple[list[str], str | None, list[str], str | None, float | None]:
    """(argv, cwd, env, user, timeout) of a request, each of its type, or QuineboxError (exit 125) naming what is not."""
    argv, cwd, env, user, timeout = (request.get(key) for key in ("argv", "cwd", "env", "user", "timeout"))
    if request.get("kind") != "exec" or not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise QuineboxError("a malformed exec request: the command is a list of strings")
    if not isinstance(env, list) or not all(isinstance(e, str) and "=" in e for e in env):
        raise QuineboxError("a malformed exec request: env is a list of NAME=VALUE")
    if not (cwd is None or isinstance(cwd, str)) or not (user is None or isinstance(user, str)):
        raise QuineboxError("a malformed exec request: cwd and user are strings")
    if not (timeout is None or isinstance(timeout, (int, float)) and timeout > 0):
        raise QuineboxError("a malformed exec request: timeout is a number of seconds")
    return argv, cwd, env, user, timeout


def _follow(conn: socket.socket, proc: BoxExec) -> None:
    """Until the caller goes: a kill it asks for, or its going (SIGKILL included), ends the exec's tree."""
    reader = conn.makefile("rb")
    try:
        for line in reader:
            if b'"kill"' in line:
                proc.kill()
    except OSError:
        pass
    if proc.returncode is None:
        proc.kill()


def _answer(conn: socket.socket, message: dict[str, Any]) -> None:
    try:
        fdpass.send(conn, message)
    except OSError:
        pass  # the caller is gone: its exec was ended with it


def exec_at_owner(session: str, argv: list[str], *, cwd: str | None, env: list[str], user: str | None, timeout: float | None) -> tuple[socket.socket, Callable[[], int]] | None:
    """Hand an exec to the owner of `session`, with this process's stdin, stdout and stderr: (the connection, to
    send {"kind": "kill"} on; a call that waits for the exit status), or None when its owner takes no execs (then
    the caller starts it the backend's own way). A refusal (a bad user, say) is raised as the owner's QuineboxError."""
    conn = fdpass.connect(str(socket_path(session)))
    if conn is None:
        return None
    fdpass.send(conn, {"kind": "exec", "argv": argv, "cwd": cwd, "env": env, "user": user, "timeout": timeout}, [0, 1, 2])

    def wait() -> int:
        answer, fds = fdpass.receive(conn, None)
        for fd in fds:
            os.close(fd)
        conn.close()
        if answer.get("kind") == "error":
            error = QuineboxError(str(answer.get("message") or "the box's owner could not start the command"))
            error.exit_code = int(answer.get("code") or EXIT_QUINEBOX)
            raise error
        if answer.get("kind") != "exit":
            raise QuineboxError(f"box {session}'s owner went away before the command ended (`quinebox box ls`)")
        return int(answer.get("code", EXIT_QUINEBOX))

    return conn, wait

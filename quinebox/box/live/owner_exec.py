"""An exec handed to the process that owns a long-lived box: how `quinebox exec --in` reaches the box's init.

Only the box's owner holds its lifeline, so only it can ask the box's init to start a command (exec_ways.py's
fast way). A caller of the same user asks it on the owner's control socket (controls.py): one frame (fdpass) with the
command and the caller's stdin, stdout and stderr riding along (SCM_RIGHTS). The owner runs it as any exec of its
own (`Sandbox.Popen`: in the exec's own cgroup, refused in a paused box), with the caller's descriptors as the
command's, so no byte passes through the owner, and answers one frame with the exit status. A caller that goes
away (SIGKILL included) ends its exec, as the watchdog of a runtime exec does; `{"kind": "kill"}` ends it early
(the caller's signals).

A caller that finds no owner answering (a box made by an older quinebox) runs the exec the backend's own way.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

from quinebox import fdpass
from quinebox.box.live import sandboxes
from quinebox.box.live.controls import control_path
from quinebox.box.live.execs import BoxExec
from quinebox.errors import QuineboxError

#: The exit status of an exec the owner could not start for a reason of quinebox's own.
EXIT_QUINEBOX = 125

#: How the owner starts an exec: `Sandbox.Popen`'s signature, the caller's descriptors as the streams.
Popen = Callable[..., BoxExec]


def serve(conn: socket.socket, request: dict[str, Any], fds: list[int], *, session: str, popen: Popen) -> None:
    """The owner's side of one `exec --in` (controls.py hands over the connection and the caller's descriptors):
    run it to its end, then answer its status, or why it could not start (QuineboxError's words and exit status).
    While it runs the box is in use (a holder's idle limit waits)."""
    try:
        argv, cwd, env, user, timeout = _checked(request, fds)
        with sandboxes.Running(session):
            # The caller's descriptors stay open here until the exec has ended: under gVisor a regular file among
            # them is written by a copier of ours (direct.py), not by the box.
            proc = popen(argv, stdin=fds[0], stdout=fds[1], stderr=fds[2], cwd=cwd, env=env, user=user)
            threading.Thread(target=_follow, args=(conn, proc), daemon=True).start()
            code = proc.wait_drained(timeout)
        _answer(conn, {"kind": "exit", "code": code})
    except QuineboxError as exc:
        _answer(conn, {"kind": "error", "code": exc.exit_code, "message": str(exc)})
    finally:
        for fd in fds:
            os.close(fd)


def _checked(request: dict[str, Any], fds: list[int]) -> tuple[list[str], str | None, dict[str, str], str | None, float | None]:
    """(argv, cwd, env, user, timeout) of a request, each of its type, or QuineboxError (exit 125) naming what is not."""
    argv, cwd, env, user, timeout = (request.get(key) for key in ("argv", "cwd", "env", "user", "timeout"))
    if len(fds) != 3:
        raise QuineboxError("a malformed exec request: it comes with the caller's stdin, stdout and stderr")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise QuineboxError("a malformed exec request: the command is a list of strings")
    if not isinstance(env, list) or not all(isinstance(e, str) and "=" in e for e in env):
        raise QuineboxError("a malformed exec request: env is a list of NAME=VALUE")
    if not (cwd is None or isinstance(cwd, str)) or not (user is None or isinstance(user, str)):
        raise QuineboxError("a malformed exec request: cwd and user are strings")
    if not (timeout is None or isinstance(timeout, (int, float)) and timeout > 0):
        raise QuineboxError("a malformed exec request: timeout is a number of seconds")
    return argv, cwd, dict(e.split("=", 1) for e in env), user, timeout


def _follow(conn: socket.socket, proc: BoxExec) -> None:
    """Until the caller goes: a kill it asks for, or its going (SIGKILL included), ends the exec's tree; a signal
    it asks for goes to the command's process (handed.py's send_signal)."""
    reader = conn.makefile("rb")
    try:
        for line in reader:
            asked = json.loads(line)
            if asked.get("kind") == "kill":
                proc.kill()
            elif asked.get("kind") == "signal" and isinstance(asked.get("signal"), int):
                proc.send_signal(asked["signal"])
    except (OSError, ValueError, AttributeError):
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
    send {"kind": "kill"} on; a call that waits for the exit status), or None when no owner answers (then the
    caller starts it the backend's own way). A refusal (a bad user, a paused box) is raised as the owner's
    QuineboxError."""
    conn = fdpass.connect(str(control_path(session)))
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

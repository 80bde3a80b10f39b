"""A long-lived box's owner answers for its box to the user's other processes: pause, resume, checkpoint, exec.

Only the process that made a box waits for its init and runs its clocks (its TTL, its idle limit), so only it can
stop those clocks while the box is paused, and only it can have a checkpoint end the box's sandbox and a
successor take over (ocibox.succeed). `quinebox box pause`, `resume`, `checkpoint` and `fork`, and the MCP tools,
from any process of the same user, ask it: one frame each way (fdpass) over run/sandboxes/<session>.ctl, in
the user's run dir (0700), answered only to a peer of the owner's own uid (or root), and of that uid only to one as
free as the owner (fdpass.unfree: a sandboxed process is refused in one line, as it would act with the owner's freedom).
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from quinebox import fdpass
from quinebox.box.live.sandboxes import records_dir
from quinebox.errors import QuineboxError

#: How long a request may take to be answered: a checkpoint of a large box writes its memory out.
ANSWER_WITHIN = 300.0

Answer = Callable[[dict[str, Any]], dict[str, Any]]
#: What takes an `exec --in` over: (the connection, the request, the caller's descriptors).
Handoff = Callable[[socket.socket, dict[str, Any], list[int]], None]


def control_path(session: str) -> Path:
    return records_dir() / f"{session}.ctl"


class Controls:
    """The owner's end: `answer(request)` is called on a thread of its own for each request (its errors answered
    as {"error", "exit"})."""

    def __init__(self, session: str, answer: Answer, *, handoff: Handoff | None = None):
        """`handoff`: given a request of kind `exec` with the connection and the descriptors that came with it
        (owner_exec.py), for as long as the exec runs; it closes them."""
        self._answer = answer
        self._handoff = handoff
        self.path = records_dir(make=True) / f"{session}.ctl"
        self._listener = fdpass.listen(str(self.path), mode=0o600, backlog=8)
        threading.Thread(target=self._accept, name=f"controls:{session}", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                uid = fdpass.peer_uid(conn)
                if uid not in (os.geteuid(), 0):
                    return
                unfree = fdpass.unfree(conn) if uid == os.geteuid() else None  # root's /proc is not a user's to read, and root is freer than any owner
                request, fds = fdpass.receive(conn, 10)
                if unfree is not None:  # a sandboxed process of this user: its exec, pause or checkpoint would have the owner's freedom
                    for fd in fds:
                        os.close(fd)
                    said = f"a box's owner answers no process less free than itself ({unfree}): ask from outside that sandbox"
                    fdpass.send(conn, {"error": said, "exit": 125, "kind": "error", "message": said, "code": 125})  # as `ask` and an exec read a refusal
                    return
                if request.get("kind") == "exec" and self._handoff is not None:
                    self._handoff(conn, request, fds)
                    return
                for fd in fds:
                    os.close(fd)
                try:
                    answer = self._answer(request)
                except QuineboxError as exc:
                    answer = {"error": str(exc), "exit": exc.exit_code}
                fdpass.send(conn, answer)
            except OSError:
                return

    def close(self) -> None:
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        self.path.unlink(missing_ok=True)


def ask(session: str, request: dict[str, Any], timeout: float = ANSWER_WITHIN) -> dict[str, Any]:
    """The box's owner's answer to `request`; QuineboxError (its own words and exit status) when it refused."""
    answer = fdpass.ask(str(control_path(session)), request, timeout)
    if answer is None:
        raise QuineboxError(f"box {session}'s owner does not answer (a box made by an older quinebox cannot be {request.get('op', 'asked')}d)")
    if not answer:
        raise QuineboxError(f"box {session}'s owner did not answer {request.get('op')!r} within {timeout:g} s")
    if "error" in answer:
        error = QuineboxError(str(answer["error"]))
        error.exit_code = int(answer.get("exit") or error.exit_code)
        raise error
    return answer

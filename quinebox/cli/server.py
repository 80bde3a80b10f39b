"""`quinebox serve`: a per-user command server that runs thin clients' commands in warm, already-imported processes.

The server imports the CLI and everything a command loads (typer, docker,
openai, the policy and seccomp data) once, then forks one worker per command,
as Mercurial's chg server does. The worker takes the client's stdin, stdout
and stderr as its own, its cwd and environment, and runs the very same CLI
code a cold `quinebox` would, so options, errors, exit codes, `--json` and
terminals are the same by construction; only the start-up is gone. Each
worker holds its client's connection: a signal the client forwards is raised
in the worker, and a client that goes away (SIGKILL included) is a SIGTERM,
which kills its boxes. Workers are processes of their own: stopping the server
ends no command that runs.

The server never starts a thread or an engine connection before it forks, so
every worker starts clean. Only the owner's uid may connect.
"""

from __future__ import annotations

import array
import json
import os
import signal
import socket
import sys
import threading
import time
from typing import Any

from quinebox.state import run_dir, serve_socket

MAX_REQUEST = 4 << 20
#: A client sends its request as it connects; one that says nothing for this long is dropped (it would hold the server up).
REQUEST_TIMEOUT = 2.0


def warm() -> None:
    """Import what commands load, so that workers inherit it instead of importing it each time.

    Nothing here may start a thread or open a connection (a forked worker would share it), and nothing of quinebox
    may read a setting from the environment at import: settings are read when used, in the worker, from the client's."""
    import importlib

    for name in ("docker", "openai", "yaml", "rich.console", "cryptography.x509", "quinebox.cli", "quinebox.api", "quinebox.agent.session",
                 "quinebox.tree.agent", "quinebox.tree.fanout", "quinebox.box.labels", "quinebox.audit.approvals"):
        importlib.import_module(name)
    from quinebox.box.spec import seccomp_base

    seccomp_base()


class Server:
    def __init__(self) -> None:
        self.path = str(serve_socket())
        self.started = time.time()
        self.served = 0
        self.listener: socket.socket | None = None

    def bind(self) -> None:
        """Listen on the state dir's socket; refuse to take it from a server that answers there."""
        from quinebox.errors import QuineboxError

        run_dir()
        answering = _connect()
        if answering is not None:
            answering.close()
            raise QuineboxError(f"a command server already answers on {self.path}: `quinebox serve stop` first")
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.path)
        os.chmod(self.path, 0o600)
        listener.listen(64)
        self.listener = listener

    def serve_forever(self) -> None:
        assert self.listener is not None
        signal.signal(signal.SIGCHLD, _reap)
        signal.signal(signal.SIGTERM, lambda *_: self.stop())
        try:
            while self.listener is not None:
                try:
                    conn, _ = self.listener.accept()
                except OSError:
                    if self.listener is None:
                        break
                    continue
                with conn:
                    try:
                        self._answer(conn)
                    except OSError:
                        pass  # a client that went away, or never said what it wanted: the next one
        finally:
            self.stop()

    def stop(self) -> None:
        listener, self.listener = self.listener, None
        if listener is not None:
            listener.close()
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    def _answer(self, conn: socket.socket) -> None:
        uid = _peer_uid(conn)
        if uid != os.getuid():
            return  # only the owner; the run dir is private anyway
        message, fds = _receive(conn)
        kind = message.get("kind")
        if kind == "run" and len(fds) in (3, 4):
            self.served += 1
            sys.stdout.flush()
            sys.stderr.flush()
            if os.fork() == 0:
                code = 125  # unless the worker gets as far as the command's own status
                try:
                    if self.listener is not None:
                        self.listener.close()  # the worker's copy: only the server accepts
                    os.setsid()
                    code = worker(conn, message, fds)
                finally:
                    os._exit(code)
        elif kind == "status":
            conn.sendall(json.dumps({"kind": "status", "pid": os.getpid(), "since": self.started, "served": self.served}).encode() + b"\n")
        elif kind == "stop":
            conn.sendall(b'{"kind": "stopping"}\n')
            self.stop()
        for fd in fds:
            os.close(fd)


def _reap(*_: Any) -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _peer_uid(conn: socket.socket) -> int:
    import struct

    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def _receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """The client's one request line, and the file descriptors sent with it."""
    conn.settimeout(REQUEST_TIMEOUT)
    data, fds = b"", array.array("i")
    while not data.endswith(b"\n") and len(data) < MAX_REQUEST:
        chunk, ancillary, _, _ = conn.recvmsg(1 << 16, socket.CMSG_SPACE(4 * fds.itemsize))
        if not chunk:
            break
        data += chunk
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    conn.settimeout(None)
    try:
        message = json.loads(data)
    except ValueError:
        message = {}
    return (message if isinstance(message, dict) else {}), list(fds)


def worker(conn: socket.socket, request: dict[str, Any], fds: list[int]) -> int:
    """In the forked process: become the client's command, run it as the CLI would, report its exit status."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    for target, fd in zip((0, 1, 2), fds):
        os.dup2(fd, target)
        os.close(fd)
    sys.stdin = open(0, "r", closefd=False)
    sys.stdout = open(1, "w", buffering=1 if os.isatty(1) else -1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in (request.get("env") or {}).items()})
    if len(fds) == 4:  # the client's controlling terminal, for questions to a person
        os.set_inheritable(fds[3], False)
        os.environ["QUINEBOX_TERMINAL_FD"] = str(fds[3])
    try:
        os.chdir(str(request.get("cwd") or "/"))
    except OSError as exc:
        print(f"quinebox: cannot work in {request.get('cwd')}: {exc.strerror}", file=sys.stderr)
        _report(conn, 125)
        return 125
    threading.Thread(target=_follow_client, args=(conn,), daemon=True).start()
    sys.argv = ["quinebox", *[str(a) for a in request.get("argv") or []]]
    from quinebox.cli.app import run_app  # its commands were registered when `quinebox serve` started this server

    try:
        run_app()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except KeyboardInterrupt:
        code = 130
    sys.stdout.flush()
    sys.stderr.flush()
    _report(conn, code)
    return code


def _report(conn: socket.socket, code: int) -> None:
    try:
        conn.sendall(json.dumps({"kind": "exit", "code": code}).encode() + b"\n")
    except OSError:
        pass


def _follow_client(conn: socket.socket) -> None:
    """Signals the client forwards are raised here; the client gone (killed, even) is a SIGTERM: its boxes die with it."""
    reader = conn.makefile("rb")
    for line in reader:
        try:
            signum = int(json.loads(line).get("signal", 0))
        except (ValueError, AttributeError, TypeError):
            continue
        if signum in {s.value for s in signal.Signals} and signum not in (signal.SIGKILL, signal.SIGSTOP):
            os.kill(os.getpid(), signum)
    os.kill(os.getpid(), signal.SIGTERM)


def _connect() -> socket.socket | None:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(serve_socket()))
    except OSError:
        conn.close()
        return None
    return conn


def _ask(kind: str) -> dict[str, Any] | None:
    """One request to the server and its answer; None when no server answers."""
    conn = _connect()
    if conn is None:
        return None
    with conn:
        conn.sendall(json.dumps({"kind": kind}).encode() + b"\n")
        conn.settimeout(5)
        try:
            answer = json.loads(conn.makefile("rb").readline())
        except (OSError, ValueError):
            return {}
    return answer if isinstance(answer, dict) else {}


def status() -> dict[str, Any] | None:
    """What the server says of itself, or None when no server answers."""
    return _ask("status") or None


def stop() -> bool:
    return _ask("stop") is not None

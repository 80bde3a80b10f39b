"""A command server's workers: processes forked from the warm server, each running its clients' commands one at a time.

A worker is forked ahead of the command it is to run (the fork of a large process is then off that command's path),
waits on a socket pair for it — the request, with the client's connection and descriptors riding along — takes the
client's stdin, stdout, stderr, cwd, environment and umask as its own, and runs the very same CLI code a cold
`quinebox` would. It dies with the server, however the server dies.

A worker whose command left it as it found it is used again, as a forked one would have been: its fork and the copy
of every page it wrote (~5 ms of CPU, ~2,400 page faults of an `exec -- true`'s ~50 ms here) are not paid twice.
As it found it means: the command ended by itself (not a signal's death), it is one of REUSED's, and nothing of it
is left in the process — no thread, no child, no descriptor (a copy of a client's stdout would keep its reader from
ever seeing the end), no signal handler, mask or timer of its own, its memory grown by less than GROWN. Anything else
and the worker exits, as every worker did once its command was done; a free worker says so to the server
("free") and waits for the next command. Dismissed (its pair closed), it exits.
"""

from __future__ import annotations

import os
import resource
import signal
import socket
import sys
import threading
from collections.abc import Iterable
from typing import Any

from quinebox import fdpass
from quinebox.processes import reap_children

Request = tuple[socket.socket, dict[str, Any], list[int]]

#: The commands after which a worker may be used again: those run most often, whose code keeps nothing in the
#: process. Every other command's worker exits once it is done.
REUSED = frozenset({"exec"})
#: How many commands one worker runs at most (whatever drifts in a long-lived process, bounded).
RUNS = 256
#: How much a worker's resident memory may grow over its commands before it exits instead of serving another.
GROWN = 64 << 20
#: How long a command's leftover threads are given to end once it has (a stream's pump finishing its last write).
THREADS_END_WITHIN = 0.5


class Worker:
    """The server's handle on one worker: its pid and its end of their socket pair. `take` hands it a command;
    `heard` reads what it says once the pair is readable; `dismiss` closes the pair (it exits)."""

    def __init__(self, listener: socket.socket | None, request: Request | None = None, *, others: Iterable[Worker] = ()):
        """Forked now; given `request` it runs that one at once. `others`: the server's other workers, whose ends of
        their pairs this one's copy closes (a worker must hear its dismissal when the server closes its end)."""
        sys.stdout.flush()
        sys.stderr.flush()
        parent = os.getpid()
        ours, theirs = socket.socketpair()
        self.pid = os.fork()
        if self.pid == 0:
            code = 125  # unless the worker gets as far as a command's own status
            try:
                ours.close()
                for other in others:
                    other.dismiss()  # this process's copy only
                if listener is not None:
                    listener.close()  # the worker's copy: only the server accepts
                code = _life(theirs, parent, request)
            finally:
                os._exit(code)
        theirs.close()
        self._sock = ours

    def fileno(self) -> int:
        return self._sock.fileno()

    def take(self, conn: socket.socket, message: dict[str, Any], fds: list[int]) -> bool:
        """Hand it a command; False when it is gone (then the server finds it another)."""
        try:
            fdpass.send(self._sock, message, [conn.fileno(), *fds])
            return True
        except OSError:
            return False

    def heard(self) -> bool:
        """What it said, its pair readable: True that it is free for another command, False that it has gone (or is going)."""
        try:
            message, fds = fdpass.receive(self._sock, 1.0)
        except OSError:
            return False
        for fd in fds:
            os.close(fd)
        return message.get("kind") == "free"

    def dismiss(self) -> None:
        self._sock.close()


def _life(pair: socket.socket, parent: int, request: Request | None) -> int:
    """The forked worker's whole life: its commands, one at a time, for as long as each leaves it clean."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.setsid()
    from quinebox.processes import die_with_parent

    die_with_parent(parent)
    handlers: dict[int, Any] = {signum: signal.getsignal(signum) for signum in signal.Signals if signum not in (signal.SIGKILL, signal.SIGSTOP)}
    mask: set[Any] = signal.pthread_sigmask(signal.SIG_BLOCK, ())
    code, started_rss = 0, _rss()
    for _ in range(RUNS):
        if request is None:
            message, fds = fdpass.receive(pair, None)
            if not message or len(fds) not in (4, 5):
                return code  # dismissed
            request = (socket.socket(fileno=fds[0]), message, fds[1:])
        before = _open_fds() - {request[0].fileno(), *request[2]}
        code, again = worker(*request)
        request = None
        if not (again and _clean(before, handlers, mask) and _rss() - started_rss < GROWN):
            return code
        try:
            fdpass.send(pair, {"kind": "free"})
        except OSError:
            return code  # the server has gone, or dismissed this worker meanwhile
    return code


def worker(conn: socket.socket, request: dict[str, Any], fds: list[int]) -> tuple[int, bool]:
    """Become the client's command, run it as the CLI would, report its exit status; then let go of everything of the
    client's. Its status, and whether it may be followed by another command in this process."""
    for target, fd in zip((0, 1, 2), fds, strict=False):  # a fourth fd, the terminal, stays where it is
        os.dup2(fd, target)
        os.close(fd)
    terminal = fds[3] if len(fds) == 4 else None
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", buffering=1 if os.isatty(1) else -1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in (request.get("env") or {}).items()})
    umask = request.get("umask")
    os.umask(umask & 0o777 if isinstance(umask, int) and not isinstance(umask, bool) else 0o022)  # the files it makes are made as the client's
    if terminal is not None:  # the client's controlling terminal, for questions to a person
        os.set_inheritable(terminal, False)
        os.environ["QUINEBOX_TERMINAL_FD"] = str(terminal)
    argv = [str(a) for a in request.get("argv") or []]
    done = threading.Event()
    follower = threading.Thread(target=_follow_client, args=(conn, done), daemon=True)
    try:
        os.chdir(str(request.get("cwd") or "/"))
    except OSError as exc:
        print(f"quinebox: cannot work in {request.get('cwd')}: {exc.strerror}", file=sys.stderr)
        code = 125
    else:
        follower.start()
        code = _run(argv)
    if code > 128:  # ended by a signal: its box is gone before the client says so, as the CLI's own promises
        _finish_removals()
    done.set()
    _report(conn, code)
    _finish_removals()  # otherwise after the client has its status: the boxes' remains go before the next command
    _let_go(conn, terminal, follower)
    return code, code <= 128 and bool(argv) and argv[0] in REUSED


def _run(argv: list[str]) -> int:
    sys.argv = ["quinebox", *argv]
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
    return code


def _let_go(conn: socket.socket, terminal: int | None, follower: threading.Thread) -> None:
    """Nothing of the client's kept: its connection (its follower ends with it), terminal, stdio, cwd and environment."""
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    if follower.is_alive():
        follower.join()
    conn.close()
    if terminal is not None:
        os.close(terminal)
    null = os.open(os.devnull, os.O_RDWR)
    for target in (0, 1, 2):
        os.dup2(null, target)
    os.close(null)
    os.chdir("/")  # a client's directory, held, could not be unmounted
    os.environ.clear()


def _clean(before: set[int], handlers: dict[int, Any], mask: set[Any]) -> bool:
    """Whether the command left nothing in this process: no thread, child, descriptor, signal mask or timer (its
    signal handlers are put back as they were)."""
    for thread in threading.enumerate():
        if thread is not threading.current_thread():
            thread.join(THREADS_END_WITHIN)
    if threading.active_count() > 1 or reap_children()[1] or _open_fds() != before:
        return False
    for signum, handler in handlers.items():  # the CLI's own (it forwards signals to its box) are done with
        if signal.getsignal(signum) != handler:
            signal.signal(signum, handler)
    return signal.pthread_sigmask(signal.SIG_BLOCK, ()) == mask and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def _open_fds() -> set[int]:
    """This process's descriptors (not the ones listing them takes: open only while it lists)."""
    import fcntl

    listed = {int(fd) for fd in os.listdir("/proc/self/fd")}
    still = set()
    for fd in listed:
        try:
            fcntl.fcntl(fd, fcntl.F_GETFD)
        except OSError:
            continue
        still.add(fd)
    return still


def _rss() -> int:
    """This process's peak resident memory so far: a command that used much and gave it back counts too."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _finish_removals() -> None:
    """Wait for the removal of the boxes this worker's command ran (a runtime's, bwrap's): a worker leaves by
    os._exit, so their atexit hooks do not run, and a removal cut short would be left to a keeper (more CPU, later)."""
    from quinebox.box.backends.bwrap.box import finish_removals as bwrap_removals
    from quinebox.box.backends.oci.box import finish_removals as oci_removals

    oci_removals()
    bwrap_removals()


def _report(conn: socket.socket, code: int) -> None:
    try:
        fdpass.send(conn, {"kind": "exit", "code": code})
    except OSError:
        pass


def _follow_client(conn: socket.socket, done: threading.Event) -> None:
    """Signals the client forwards are raised here; the client gone (killed, even) while its command runs is a
    SIGTERM: its boxes die with it."""
    while True:
        try:
            message, fds = fdpass.receive(conn, None)
        except OSError:
            break
        for fd in fds:
            os.close(fd)
        if not message:
            break
        signum = message.get("signal")
        if isinstance(signum, int) and signum in {s.value for s in signal.Signals} and signum not in (signal.SIGKILL, signal.SIGSTOP) and not done.is_set():
            os.kill(os.getpid(), signum)
    if not done.is_set():
        os.kill(os.getpid(), signal.SIGTERM)

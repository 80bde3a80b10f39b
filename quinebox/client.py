"""The `quinebox` command's entry point: a thin client when a command server answers, the full CLI otherwise.

Like Mercurial's chg: for `exec`, `run`, `map`, `batch` and `shell`, when
`quinebox serve` listens on the state dir's socket (and QUINEBOX_SERVE is
not `off`), hand the server argv, cwd, the environment and this process's
stdin, stdout and stderr themselves (SCM_RIGHTS), forward the signals we get,
and exit with the status it reports. The server runs the very same CLI code
in a process of its own, already imported, so everything behaves as without
it. With no server, this costs one failed connect.

Stdlib only, and nothing of quinebox but the state dir's paths: this is what
makes the thin path fast.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys

from quinebox import fdpass
from quinebox.state import serve_socket

#: The commands that go through a server; the rest are quick, or are about the server itself.
THIN = ("exec", "run", "map", "batch", "shell")
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGWINCH, signal.SIGUSR1, signal.SIGUSR2)
EXIT_QUINEBOX = 125


def main() -> None:
    argv = sys.argv[1:]
    if argv and argv[0] in THIN and os.environ.get("QUINEBOX_SERVE", "auto") != "off":
        for fd in (0, 1, 2):  # closed stdio gets /dev/null before any socket can become fd 0-2 (and be sent as stdin)
            try:
                os.fstat(fd)
            except OSError:
                os.open(os.devnull, os.O_RDWR)
        server = fdpass.connect(serve_socket())
        if server is not None:
            code = through(server, argv)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)  # nothing is left to clean up, and a thin client's exit should be as quick as its start
    from quinebox.cli import main as full

    full()


def through(server: socket.socket, argv: list[str]) -> int:
    """Run argv in the server with our stdio; our signals go to it; its exit status is ours."""
    fds = [0, 1, 2]
    try:  # the controlling terminal, where questions for a person go (audit/prompt.py): the worker has none of its own
        fds.append(os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC))
    except OSError:
        pass
    fdpass.send(server, {"kind": "run", "argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}, fds)
    for fd in fds[3:]:
        os.close(fd)

    forwarded: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        if signum != signal.SIGWINCH:
            forwarded.append(signum)
        try:
            fdpass.send(server, {"kind": "signal", "signal": signum})
        except OSError:
            pass

    for signum in FORWARDED:
        signal.signal(signum, forward)
    reader = server.makefile("rb")
    while True:
        try:
            line = reader.readline()
        except InterruptedError:
            continue
        if not line:
            if forwarded:  # it died of the signal we passed on, before the command could catch it: as a cold run would
                return 128 + forwarded[0]
            print("quinebox: the command server's worker for this command is gone (`quinebox serve status`); run again", file=sys.stderr)
            return EXIT_QUINEBOX
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if message.get("kind") == "exit":
            return int(message.get("code", EXIT_QUINEBOX))

"""The first process quinebox runs in every box: it ties the box's life to the host's.

It connects to the host's socket, then runs the command with the box's own
stdin, stdout and stderr. If that connection breaks — the host process died,
even by SIGKILL — it kills every process in the box and exits, so the box
stops and the engine removes it. Otherwise it exits with the command's status,
mapped as a shell would (126 not executable, 127 not found, 128+n signal n).

The agent loop holds its lifeline itself (`connect` and `watch` below), so an
agent box runs one interpreter, not two.

Runs inside untrusted boxes: stdlib only, small, no state.
"""

import os
import select
import signal
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # -I leaves the script's directory off sys.path
import forwarder  # noqa: E402

HOST_SOCKET = "/run/quinebox/host.sock"
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
#: On a terminal the kernel sends these to the foreground processes, the command included: not ours to forward.
FROM_THE_TERMINAL = (signal.SIGINT, signal.SIGQUIT, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)


def say(message):
    os.write(2, f"quinebox: {message}\n".encode(errors="replace"))


def kill_everything():
    """Signal every process this user may signal in the box's pid namespace, then leave."""
    try:
        os.kill(-1, signal.SIGKILL)
    except OSError:
        pass
    os._exit(137)


def connect():
    """The lifeline, or None when the host is already gone."""
    lifeline = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        lifeline.connect(HOST_SOCKET)
    except OSError:
        lifeline.close()
        return None
    return lifeline


def watch(lifeline):
    """Block until the host goes away, then end the box. Run it on a thread of its own."""
    while True:
        try:
            data = lifeline.recv(65536)
        except InterruptedError:
            continue
        except OSError:
            data = b""
        if not data:
            kill_everything()


def spawn(argv):
    try:
        # Python ignores SIGPIPE and SIGXFSZ; the command must get the defaults back.
        return os.posix_spawnp(argv[0], argv, os.environ, setsigdef=(signal.SIGPIPE, signal.SIGXFSZ, *FROM_THE_TERMINAL))
    except FileNotFoundError:
        say(f"{argv[0]}: command not found")
        sys.exit(127)
    except (PermissionError, IsADirectoryError, OSError) as exc:
        say(f"{argv[0]}: cannot execute: {exc.strerror}")
        sys.exit(126)


def main(argv):
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        say("lifeline: no command given")
        return 125
    lifeline = connect()
    if lifeline is None:
        say("the host is gone; not starting")
        return 137
    forwarder.start()
    child = spawn(argv)

    def forward(signum, _frame):
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    for signum in FORWARDED:
        signal.signal(signum, forward)
    if os.isatty(0):
        for signum in FROM_THE_TERMINAL:
            signal.signal(signum, signal.SIG_IGN)
    pidfd = os.pidfd_open(child)
    while True:
        try:
            ready, _, _ = select.select([lifeline, pidfd], [], [])
        except InterruptedError:
            continue
        if pidfd in ready:
            _, status = os.waitpid(child, 0)
            code = os.waitstatus_to_exitcode(status)
            return code if code >= 0 else 128 - code
        try:
            data = lifeline.recv(65536)
        except OSError:
            data = b""
        if not data:
            kill_everything()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

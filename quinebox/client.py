"""The `quinebox` command's entry point: a thin client when a command server answers, the full CLI otherwise.

Like Mercurial's chg: for `exec`, `run`, `map`, `batch` and `shell`, when
`quinebox serve` listens on the state dir's socket (and QUINEBOX_SERVE is
not `off`), hand the server argv, cwd, the environment, the umask and this
process's stdin, stdout and stderr themselves (SCM_RIGHTS), forward the signals we get,
and exit with the status it reports. The server runs the very same CLI code
in a process of its own, already imported, so everything behaves as without
it. With no server, this costs one failed connect.

When none answers, the client starts one, detached, and runs this command
in-process meanwhile: a server takes longer to import everything than one
command takes to run, so the next command is the first to go through it (and
the server's imports wait for this client to exit, so as not to slow it).
A server whose code or config.yaml changed since it started hands a command
back unrun and exits (cli/freshness.py); the client then starts a new one and
runs that command in-process too. A server hands back, too, the command of a
process less free than itself (a sandboxed agent's: cli/server.py), which then
runs it in-process, under its own confinement. A server exits on its own once
idle, or once its state dir is gone.

The state dir must be this user's (state.py): another's is refused in one line
before anything is sent or written, and a server socket that answers as
another user's process is sent nothing (fdpass.connect).

QUINEBOX_SERVE says which: `auto` (the default) uses the user's server and
starts one when none answers; `manual` uses one only if the user started it
(`quinebox serve`); `off` keeps every command in-process.

Where scripts/setup.sh could build it, the `quinebox` command is the native
client (bin/quinebox.c), which does the served path alone without an
interpreter's start and execs this one (the venv's `quinebox-py`) for
everything else, with why the server handed the command back, if it did, or
that another user's process answered on the socket (QUINEBOX_HANDED), so that
it is not asked again.

Stdlib only, and nothing of quinebox but the state dir's paths and the frames
its processes speak (fdpass.py: `_socket` and `marshal`, no json, socket or
enum); quinebox.errors (enum, typing) only once something is refused: this is
what makes the thin path fast.
"""

from __future__ import annotations

import _socket
import os
import select
import sys
import time

from quinebox import fdpass
from quinebox.state import open_private, run_path, serve_socket, state_root

TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal  # typeshed describes _signal only as signal
else:
    import _signal as signal  # the signal module itself imports enum: a fifth of this client's start-up

#: The commands that go through a server; the rest are quick, or are about the server itself.
THIN = ("exec", "run", "map", "batch", "shell")
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGWINCH, signal.SIGUSR1, signal.SIGUSR2)
MODES = ("auto", "manual", "off")
#: Why a server hands a command back unrun (through's words), as the native client passes them on in QUINEBOX_HANDED.
HANDED_BACK = ("stale", "confined")
#: QUINEBOX_HANDED's word from the native client for a server socket that answered as another user (`foreign:UID`).
FOREIGN = "foreign:"
EXIT_QUINEBOX = 125
EXIT_USAGE = 2
#: Once a client has started a server, no client starts another for this long: the first is still importing, or it
#: failed (serve.log in the state dir says why) and would fail again.
START_AGAIN_AFTER = 30.0
#: The server a client starts begins its imports when that client exits, or after this long if it is still running:
#: they take a second of CPU, which the command the client runs meanwhile would otherwise share.
START_AFTER = 2.0


def main() -> None:
    argv = sys.argv[1:]
    mode = os.environ.get("QUINEBOX_SERVE", "auto")
    # The native client (bin/quinebox.c) asked a server already, which handed the command back: why, and not again.
    handed_back = os.environ.pop("QUINEBOX_HANDED", "")
    if argv and argv[0] in THIN and mode not in MODES:
        print(f"quinebox: QUINEBOX_SERVE={mode!r} is none of auto, manual or off; set one of those, or unset it", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    if argv and argv[0] in THIN and mode != "off":
        for fd in (0, 1, 2):  # closed stdio gets /dev/null before any socket can become fd 0-2 (and be sent as stdin)
            try:
                os.fstat(fd)
            except OSError:
                os.open(os.devnull, os.O_RDWR)
        try:
            path = serve_socket()  # a state dir that is not this user's is refused here: nothing sent, nothing written
        except Exception as exc:
            if not refused(exc):
                raise
            print(f"quinebox: {exc}", file=sys.stderr)
            sys.exit(EXIT_QUINEBOX)
        try:
            if handed_back.startswith(FOREIGN) and handed_back[len(FOREIGN):].isdigit():  # the native client found one
                raise fdpass.foreign(path, int(handed_back[len(FOREIGN):]))
            server = fdpass.connect(path, _socket.socket) if handed_back not in HANDED_BACK else None
        except Exception as exc:  # another user's server: it got no byte; this command runs in-process, and starts none
            if not refused(exc):
                raise
            print(f"quinebox: {exc} (this command runs in-process)", file=sys.stderr)
            server, mode = None, "manual"
        handed: int | str = handed_back if handed_back in HANDED_BACK else "none"
        if server is not None:
            handed = through(server, argv)
            if isinstance(handed, int):
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(handed)  # nothing is left to clean up, and a thin client's exit should be as quick as its start
        if mode == "auto" and handed != "confined":  # none answered, or the one that did has old code and is going
            start_server(again=handed == "stale")
    from quinebox.cli import main as full

    full()


def refused(exc: Exception) -> bool:
    """Whether `exc` is quinebox's refusal of the state dir or of a server (a StateError): quinebox.errors is
    imported only once something was raised, as it imports enum and typing, most of this client's start-up."""
    from quinebox.errors import StateError

    return isinstance(exc, StateError)


def start_server(again: bool = False) -> None:
    """Start the user's command server detached, and do not wait for it (`again`: its predecessor just exited stale).

    Its marker (run/serve.started) and log (serve.log) are opened never through a link (state.open_private): one
    planted there is refused in one line, and no server is started."""
    root = state_root()
    marker = os.path.join(root, "run", "serve.started")
    try:
        if not again and time.time() - os.lstat(marker).st_mtime < START_AGAIN_AFTER:
            return
    except OSError:
        pass
    try:
        run_path()  # made (0700) and checked as the state dir is
        try:
            os.unlink(marker)
        except FileNotFoundError:
            pass
        os.close(open_private(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL))  # made anew: another client making it too starts none
        log = open_private(os.path.join(root, "serve.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    except OSError:
        return  # a state dir this user cannot write, or another client starting one this instant: the command goes on in-process
    except Exception as exc:
        if not refused(exc):
            raise
        print(f"quinebox: {exc} (this command runs in-process, and starts no command server)", file=sys.stderr)
        return
    env = {**os.environ, "QUINEBOX_STATE_DIR": root}  # absolute: the server works in / (it keeps no directory of the user's busy)
    gate, held = os.pipe()  # we hold `held` open until we exit; the server's imports wait for that (START_AFTER)
    pid = os.fork()
    if pid == 0:  # a session of its own, and not our child (a grandchild nobody waits for: init reaps it)
        try:
            os.setsid()
            if os.fork() == 0:
                os.close(held)
                select.select([gate], [], [], START_AFTER)
                os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
                os.dup2(log, 1)
                os.dup2(log, 2)
                os.closerange(3, 1 << 20)  # nothing the caller passed us: a pipe it waits on must see EOF when we exit
                os.chdir("/")
                os.execve(sys.executable, [sys.executable, "-m", "quinebox", "serve"], env)
        finally:
            os._exit(0)
    os.close(log)
    os.close(gate)
    os.waitpid(pid, 0)


def through(server: _socket.socket, argv: list[str]) -> int | str:
    """Run argv in the server with our stdio; our signals go to it; its exit status is ours. A word instead when the
    server handed it back unrun: `stale`, its code or config is older than ours (it is exiting); `confined`, this
    process is less free than the server (another namespace, NoNewPrivs, seccomp, fewer capabilities: fdpass.unfree),
    so it runs the command itself, under its own confinement."""
    fds = [0, 1, 2]
    try:  # the controlling terminal, where questions for a person go (audit/prompt.py): the worker has none of its own
        fds.append(os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC))
    except OSError:
        pass
    umask = os.umask(0o022)  # read by setting it: put back at once
    os.umask(umask)
    fdpass.send(server, {"kind": "run", "argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), "umask": umask}, fds)
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

    before = {signum: signal.signal(signum, forward) for signum in FORWARDED}
    while True:
        try:
            message, fds = fdpass.receive(server, None)
        except OSError:
            message, fds = {}, []
        for fd in fds:
            os.close(fd)
        if not message:
            if forwarded:  # it died of the signal we passed on, before the command could catch it: as a cold run would
                return 128 + forwarded[0]
            print("quinebox: the command server's worker for this command is gone (`quinebox serve status`); run again", file=sys.stderr)
            return EXIT_QUINEBOX
        if message.get("kind") == "exit":
            return int(message.get("code", EXIT_QUINEBOX))
        if message.get("kind") in ("stale", "confined"):
            for signum, handler in before.items():
                signal.signal(signum, handler)
            server.close()
            return str(message["kind"])

"""The box's init: what lifeline.py, the first process quinebox runs in every box, runs (lifeline.py says what it
does). Its code lives here, not in the script: Python compiles the script it is given from source at every start,
~3 ms of CPU of every box's, where a module it imports is read from the bytecode images/runtime.sh compiled.

The agent loop holds its lifeline itself (`connect` and `watch` below), so an agent box runs one interpreter, not two.

Runs inside untrusted boxes: stdlib only, small, no state. Nothing is imported that a box's start does not use: the
interpreter's own modules and the builtin ones (`os` is posix's functions behind path and mapping modules, ~1 ms of a
start: posix is called instead); the rest comes on need.
"""

import _socket as socket  # signal and socket without their enum wrappers: enum, json and threading
import posix  # are a third of an interpreter's start-up in a box, paid by every box
import select
import sys

TYPE_CHECKING = False  # typing's flag, without importing typing (start-up): mypy reads the guest as the package, a box runs it flat
if TYPE_CHECKING:
    import signal  # typeshed describes _signal only as signal
else:
    import _signal as signal

HOST_SOCKET = "/run/quinebox/host.sock"
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
#: How often the box's init (on an OCI runtime, where it is pid 1) waits for orphans that have exited.
REAP_EVERY = 0.5
#: Hundredths of a second a box's command may wait for its terminal's size (await_size).
SIZE_TRIES = 200
#: On a terminal the kernel sends these to the foreground processes, the command included: not ours to forward.
FROM_THE_TERMINAL = (signal.SIGINT, signal.SIGQUIT, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)


def say(message):
    posix.write(2, f"quinebox: {message}\n".encode(errors="replace"))


def kill_everything():
    """Signal every process this user may signal in the box's pid namespace, then leave."""
    try:
        posix.kill(-1, signal.SIGKILL)
    except OSError:
        pass
    posix._exit(137)


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


def spawn(argv, env):
    try:
        # Python ignores SIGPIPE and SIGXFSZ; the command must get the defaults back.
        return posix.posix_spawnp(argv[0], argv, env, setsigdef=(signal.SIGPIPE, signal.SIGXFSZ, *FROM_THE_TERMINAL))
    except FileNotFoundError:
        say(f"{argv[0]}: command not found")
        sys.exit(127)
    except (PermissionError, IsADirectoryError, OSError) as exc:
        say(f"{argv[0]}: cannot execute: {exc.strerror}")
        sys.exit(126)


def await_size(fd, tries=SIZE_TRIES):
    """A terminal the engine makes has no size until the host's first resize, which may come after the box has
    started (on a busy machine, after the command's first `stty size`, which then says 0 0): wait for it a little.
    A runtime's console is sized before the box starts, and goes on at once."""
    for _ in range(tries):
        try:
            if posix.get_terminal_size(fd) != (0, 0):
                return
        except OSError:
            return
        select.select([], [], [], 0.01)


_keep: list[object] = []


def chld_wake():
    """A socket select() finds readable after each SIGCHLD (the kernel's signal writes to its twin): one per
    process, made on first need."""
    if _keep:
        return _keep[0]
    wake_r, wake_w = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    for end in (wake_r, wake_w):
        end.setblocking(False)
    _keep.extend((wake_r, wake_w))  # the kernel's signal writes go to it for as long as we live
    signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    return wake_r


def exited_fd(child):
    """Something select() finds readable once `child` has exited: its pidfd, or where the kernel has none
    (gVisor's, 2022) the SIGCHLD wake-up."""
    try:
        return posix.pidfd_open(child)
    except OSError:
        pass
    wake = chld_wake()
    posix.kill(posix.getpid(), signal.SIGCHLD)  # it may have exited before the handler was there: look once at once
    return wake


def reap(child, execs):
    """Wait for every child that has exited (as the box's init, every orphan too): the command's status if it is
    among them; an exec's is told to the host."""
    while True:
        try:
            pid, status = posix.waitpid(-1, posix.WNOHANG)
        except ChildProcessError:
            return None
        if pid == 0:
            return None
        if pid == child:
            return status
        if execs is not None:
            execs.reaped(pid, status)


def claimed(line):
    """A warm box's wait for its command: (argv, environment, whether an agent takes over, its stdio if handed
    over); the host gone, or anything but a claim, ends the box. On an OCI runtime the claimer's own stdin,
    stdout and stderr come with the claim (SCM_RIGHTS): the box writes them itself, as a cold box would."""
    try:
        frames = line.read()
        while not frames:
            frames = line.read()
    except (EOFError, OSError, ValueError):
        kill_everything()
    (claim, fds), line.pending = frames[0], frames[1:]
    if not isinstance(claim, dict) or claim.get("kind") != "claim" or len(fds) not in (0, 3):
        kill_everything()
    return [str(a) for a in claim["argv"]], {str(k): str(v) for k, v in claim["env"].items()}, bool(claim.get("agent")), fds


def engine_environment():
    """The environment the engine started us with (the image's), before Python's start-up added to it (PEP 538's
    LC_CTYPE): a cold box's command gets the image's environment and ours, and nothing else."""
    with open("/proc/self/environ", "rb") as initial:
        items = initial.read().split(b"\0")
    encoding, errors = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()  # os.fsdecode's
    return dict(item.decode(encoding, errors).split("=", 1) for item in items if b"=" in item)


def take_over(argv, lifeline):
    """Become the agent loop, handing it the lifeline as a cold agent box's loop would have connected it."""
    import fcntl

    held = fcntl.fcntl(lifeline.fileno(), fcntl.F_DUPFD, 10)  # above fds 3-5, where the loop moves the box's stdio
    posix.set_inheritable(held, True)
    cut = argv.index("--")
    argv[cut:cut] = ["--lifeline", str(held)]
    posix.execv(argv[0], argv)


#: Said once the lifeline is up, before anything else: the host's end knows this connection for the box's init's,
#: which starts execs beside the command (execs.py); a host from before execs took this hello and answered none.
#: Constant bytes: a frame (protocol.py) with no json import.
HELLO = b'{"kind":"hello","role":"lifeline","serves":["exec"]}'
HELLO_FRAME = len(HELLO).to_bytes(4, "big") + bytes(4) + HELLO
#: Said when the command died of SIGKILL, the kernel OOM killer's signal (killed): constant bytes, as HELLO.
KILLED = b'{"kind":"killed"}'
KILLED_FRAME = len(KILLED).to_bytes(4, "big") + bytes(4) + KILLED
#: Seconds the init waits for the host's word on it before it exits all the same.
KILLED_WAIT = 2.0


def killed(lifeline):
    """Tell the host the command died of SIGKILL, and wait a little for its word: until the init exits, the box's
    cgroup stands, and with it the kernel's count of OOM kills there, which the host reads. The Docker engine's own
    `oom` event may never come: containerd drops one it reads after the box's cgroup is gone. What the host says
    next ends the wait, whatever it is (a box ending has nothing else to hear)."""
    try:
        lifeline.sendall(KILLED_FRAME)
        select.select([lifeline], [], [], KILLED_WAIT)
    except OSError:
        pass


def main(argv):
    pooled = argv == ["--pool"]  # a command is always given after "--", so no command can be taken for this
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        say("lifeline: no command given")
        return 125
    lifeline = connect()
    if lifeline is None:
        say("the host is gone; not starting")
        return 137
    try:
        lifeline.sendall(HELLO_FRAME)
    except OSError:
        kill_everything()
    line = None
    environment = engine_environment()  # the box's own, which each exec beside the command adds to
    env: dict = posix.environ  # what the command starts with: a cold box's as it came
    if pooled:
        import os  # its environ: the claim's, for the command and for an agent's loop, which this process becomes

        if TYPE_CHECKING:
            from quinebox.guest import execs as lines
        else:
            import execs as lines

        line = lines.Line(lifeline)
        argv, given, agent, stdio = claimed(line)
        environment.update(given)
        os.environ.clear()
        os.environ.update(environment)
        env = environment
        for target, fd in enumerate(stdio):
            posix.dup2(fd, target)
            posix.close(fd)
        if agent:
            take_over(argv, lifeline)
    forwarding = None
    if environment.get("QUINEBOX_EGRESS"):  # only a box with egress has a forwarder (and threads)
        if TYPE_CHECKING:
            from quinebox.guest import forwarder
        else:
            import forwarder

        forwarding = forwarder.start()
    if posix.isatty(0):
        await_size(0)
    child = 0
    early: list[int] = []  # a signal that came while the command was being started: it is the command's as soon as it runs

    def forward(signum, _frame):
        if not child:
            early.append(signum)
            return
        try:
            posix.kill(child, signum)
        except ProcessLookupError:
            pass

    for signum in FORWARDED:  # before the command runs: as pid 1 this process drops a signal it has no handler for
        signal.signal(signum, forward)
    child = spawn(argv, env)
    for came in early:
        forward(came, None)
    if posix.isatty(0):
        for signum in FROM_THE_TERMINAL:
            signal.signal(signum, signal.SIG_IGN)
    pidfd = exited_fd(child)
    init = posix.getpid() == 1  # on an OCI runtime no init stands in front of us: orphans are ours to reap
    execs = None  # the execs beside the command, once the host asks for one
    dropped = None  # the lifeline let go of around a checkpoint (guest/checkpoints.py), until dialled again
    while True:
        watched = [pidfd] if dropped is not None else [lifeline, pidfd] if execs is None or _keep[0] is pidfd else [lifeline, pidfd, _keep[0]]
        try:
            ready, _, _ = select.select(watched, [], [], dropped.poll if dropped is not None else REAP_EVERY if init else None)
        except InterruptedError:
            continue
        for woken in ready:
            if not isinstance(woken, int) and woken is not lifeline:
                woken.recv(4096)  # a SIGCHLD woke us: whose, waitpid says
        status = reap(child, execs) if init or execs is not None else None
        if status is None and pidfd in ready and execs is None:
            pid, status = posix.waitpid(child, 0 if isinstance(pidfd, int) else posix.WNOHANG)
            status = status if pid == child else None
        if status is not None:
            code = posix.waitstatus_to_exitcode(status)
            if code == -signal.SIGKILL and dropped is None:
                killed(lifeline)
            return code if code >= 0 else 128 - code
        if dropped is not None:
            redialled = dropped.redialled()
            if redialled is not None:
                lifeline, forwarding, dropped = redialled, dropped.forwarding, None
                line = lines.Line(lifeline)
                if execs is not None:
                    execs.line = line
            continue
        if lifeline not in ready:
            continue
        if line is None:
            if TYPE_CHECKING:
                from quinebox.guest import execs as lines
            else:
                import execs as lines

            line = lines.Line(lifeline)
        try:
            frames, line.pending = [*line.pending, *line.read()], []
        except (EOFError, OSError, ValueError):
            kill_everything()
        for message, fds in frames:
            kind = message.get("kind") if isinstance(message, dict) else None
            if kind == "exec":
                if execs is None:
                    chld_wake()
                    execs = lines.Execs(line, environment)
                execs.start(message, fds)
                continue
            for fd in fds:
                posix.close(fd)
            if kind == "drop":
                dropped = drop(line, forwarding, execs)


def drop(line, forwarding, execs):
    """The host asks, before a checkpoint, that the init let go of its lifeline (guest/checkpoints.py): a `Dropped`
    once it has, None when something holds the host's files (it said what: the host refuses the checkpoint)."""
    if TYPE_CHECKING:
        from quinebox.guest import checkpoints
    else:
        import checkpoints

    running = len(execs.running) if execs is not None else 0
    if running:
        line.send({"kind": "kept", "held": [f"the box's init runs {running} exec(s), whose stdin, stdout and stderr are the host's"]})
        return None
    return checkpoints.let_go(line.sock, forwarding, dial)


def dial():
    """The lifeline dialled again after a checkpoint; a host that is gone ends the box."""
    lifeline = connect()
    if lifeline is None:
        kill_everything()
    return lifeline


def run(argv):
    """main's status as the process's, with no interpreter teardown between the command's end and the box's (it
    writes with posix.write only: nothing is buffered)."""
    posix._exit(main(argv))

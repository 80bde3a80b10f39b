"""What removes a quinebox process's boxes (a runtime's, bwrap's) when that process dies without removing them itself.

A box on an OCI runtime or bubblewrap has no engine to remove it: its holder removes it once it has exited. A holder
killed by SIGKILL cannot, so a keeper does: one process, in a session of its own, told over a pipe which boxes each
holder holds — a JSON line {"hold": KEY, "kind": KIND, "by": [PID, START], …} before making one (the runtime box's
{"bundle", "runtime"}, bwrap's KEY its record's path), {"release": KEY} once it is removed. Each kind's backend says
how its boxes go (`sweeps`). One keeper serves a process tree: the first process that needs one forks it, and a
child forked from that process (a command server's workers, its pool's keeper, a box's holder) writes to the pipe
it inherited instead of forking its own, each line under PIPE_BUF so that none interleaves with another's. The
keeper watches each holder by a pidfd (its /proc start time checked, so a reused pid is no holder): when one
dies, what it still holds goes, while the others go on; when the pipe ends — every writer gone, however they died —
whatever is still held goes, and the keeper leaves. `quinebox serve` forks its keeper before any worker, so a served
command forks none (a fork of a large process, ~3 ms of CPU, and the keeper's own life and exit).

Forked, not started anew: a new interpreter's start-up (~15 ms of CPU) would be paid by every first box. The keeper
keeps nothing of its forker's open but its end of the pipe, touches none of its locks or objects (system calls,
json, and each kind's removal, which runs `subprocess` and its own module's functions), and leaves with os._exit.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from quinebox.processes import process_start_ticks

#: What /proc/PID/comm says of a keeper (a forked process otherwise looks like its forker).
NAME = b"quinebox-keeper"
PR_SET_NAME = 15
#: Signals a Python forker may have handlers for: a keeper takes the defaults (it has no forker's code to run).
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGWINCH, signal.SIGCHLD)

#: How each kind of box goes, given its hold line: registered by each backend's box module as it is imported.
Sweep = Callable[[dict[str, Any]], None]
_sweeps: dict[str, Sweep] = {}


@dataclass(frozen=True)
class _Keeper:
    pid: int
    fd: int
    #: The pipe's identity, so that a forked child whose fd number now names something else never writes there.
    pipe: tuple[int, int]
    #: The kinds it can remove: those registered when it was forked.
    kinds: frozenset[str]
    #: The process that forked it (its parent, which alone may wait for it).
    forker: int


_keeper: _Keeper | None = None
#: The keeper each box this process holds was told of (its release goes there: a keeper forked since for a kind the
#: first could not remove keeps what the first was told).
_where: dict[str, _Keeper] = {}
_lock = threading.Lock()
#: This process as a holder: (pid, its start time), read once per process.
_me: tuple[int, str] = (0, "")


def _fresh_lock() -> None:
    global _lock
    _lock = threading.Lock()  # a child forked while another thread told: that thread is not in the child


os.register_at_fork(after_in_child=_fresh_lock)


def sweeps(kind: str, sweep: Sweep) -> None:
    """Register how boxes of `kind` go (at import: a keeper forked before cannot remove them, so the first hold of
    `kind` a process tells such a keeper forks one that can)."""
    _sweeps[kind] = sweep


def hold(kind: str, key: str, **about: Any) -> None:
    """Tell the keeper of a box about to be made: it removes it (its kind's sweep, given this line) if this process dies first."""
    _tell({"hold": key, "kind": kind, **about}, kind)


def release(key: str) -> None:
    """The box is removed: the keeper forgets it."""
    _tell({"release": key}, None)


def start() -> None:
    """Fork this process's keeper now, unless one it inherited or forked runs and removes every kind registered (a
    command server, before its first worker: each worker then uses it)."""
    with _lock:
        if _keeper is None or not _its_pipe(_keeper) or not frozenset(_sweeps) <= _keeper.kinds:
            _replace()


def _tell(line: dict[str, Any], kind: str | None) -> None:
    """One line to the keeper, as this process (forked the first time, or when it died, or cannot remove `kind`)."""
    global _me
    if _me[0] != os.getpid():
        _me = (os.getpid(), process_start_ticks(os.getpid()))
    data = json.dumps({**line, "by": list(_me)}).encode() + b"\n"  # far below PIPE_BUF: written whole
    key = str(line.get("hold", line.get("release")))
    with _lock:
        keeper = _usable(_where.pop(key, None) if kind is None else _keeper, kind)
        for _ in range(2):  # a keeper that died is replaced once: what it held is left to `quinebox gc`
            if keeper is None:
                if kind is None:
                    return  # a release with no keeper to tell: none holds it
                keeper = _replace()
            try:
                os.write(keeper.fd, data)
                break
            except OSError:
                _forget(keeper)
                keeper = None
        if kind is not None and keeper is not None:
            _where[key] = keeper


def _usable(keeper: _Keeper | None, kind: str | None) -> _Keeper | None:
    """`keeper` if this process may still tell it (its fd is its pipe) and it removes `kind` (None: any)."""
    if keeper is None or (kind is not None and kind not in keeper.kinds) or not _its_pipe(keeper):
        return None
    return keeper


def _its_pipe(keeper: _Keeper) -> bool:
    try:
        info = os.fstat(keeper.fd)
    except OSError:
        return False
    return stat.S_ISFIFO(info.st_mode) and (info.st_dev, info.st_ino) == keeper.pipe


def _forget(keeper: _Keeper) -> None:
    """A keeper that is gone: its fd closed, and waited for if this process forked it."""
    global _keeper
    with contextlib.suppress(OSError):
        os.close(keeper.fd)
    if keeper.forker == os.getpid():
        with contextlib.suppress(ChildProcessError):
            os.waitpid(keeper.pid, os.WNOHANG)
    if _keeper is keeper:
        _keeper = None


def _replace() -> _Keeper:
    """Fork a keeper for every kind registered; the current one, if any, keeps what it was told (`_where`)."""
    global _keeper
    told, tell = os.pipe()  # both close-on-exec: no runtime or box ever holds the keeper's pipe
    pid = os.fork()
    if pid == 0:  # the keeper
        try:
            os.setsid()  # the forker's terminal's signals are not for it
            os.chdir("/")  # holds no directory of the forker's busy
            os.dup2(told, 0)
            null = os.open(os.devnull, os.O_RDWR)
            os.dup2(null, 1)
            os.dup2(null, 2)
            os.closerange(3, os.sysconf("SC_OPEN_MAX"))
            for signum in _SIGNALS:
                signal.signal(signum, signal.SIG_DFL)
            _name_self()
            keep(0)
        finally:
            os._exit(0)
    os.close(told)
    info = os.fstat(tell)
    _keeper = _Keeper(pid, tell, (info.st_dev, info.st_ino), frozenset(_sweeps), os.getpid())
    return _keeper


# -- the keeper's own life -------------------------------------------------------------------------------------------

#: A holder: its pid and its /proc start time.
Holder = tuple[int, str]


def keep(fd: int) -> None:
    """Follow the lines on `fd` until it ends, removing what each holder still holds when it dies; then the rest.

    Each turn reads every line already written before it looks at who died: a holder's release, written before
    it exited, is read before its death is acted on (no box is removed twice)."""
    held: dict[str, tuple[Holder | None, dict[str, Any]]] = {}
    watched: dict[int, Holder] = {}  # pidfd -> the holder it watches
    pidfds: dict[Holder, int] = {}
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    os.set_blocking(fd, False)
    pending = b""
    ended = False

    def watch(holder: Holder) -> bool:
        """Whether `holder` still runs (its pidfd kept, to hear when it ends)."""
        if holder in pidfds:
            return True
        try:
            pidfd = os.pidfd_open(holder[0])
        except ProcessLookupError:
            return False
        except OSError:
            return True  # no fd left to watch it by (EMFILE): what it holds waits for the pipe's end, never swept early
        if process_start_ticks(holder[0]) != holder[1]:  # a reused pid: that holder is gone
            os.close(pidfd)
            return False
        pidfds[holder] = pidfd
        watched[pidfd] = holder
        poller.register(pidfd, select.POLLIN)
        return True

    while not ended:
        events = poller.poll()
        fresh: set[Holder] = set()
        while True:  # every line written so far
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                break
            if not chunk:
                ended = True
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                try:
                    told = json.loads(raw)
                    by = told.get("by")
                    holder = (int(by[0]), str(by[1])) if isinstance(by, list) and len(by) == 2 else None
                    if "hold" in told:
                        held[str(told["hold"])] = (holder, told)
                        if holder is not None:
                            fresh.add(holder)
                    else:
                        held.pop(str(told.get("release")), None)
                except (ValueError, KeyError, TypeError, AttributeError, IndexError):
                    continue  # never from a holder of ours; nothing to act on
        dead = {holder for holder in fresh if not watch(holder)} | {watched[ready] for ready, _ in events if ready in watched}
        for holder in dead:
            pidfd = pidfds.pop(holder, None)
            if pidfd is not None:
                poller.unregister(pidfd)
                del watched[pidfd]
                os.close(pidfd)
            theirs = [key for key, (by, _) in held.items() if by == holder]
            sweep([held.pop(key)[1] for key in theirs])
    sweep([line for _, line in held.values()])


def sweep(lines: list[dict[str, Any]]) -> None:
    """Remove each box held by its kind's sweep, given its hold line; one whose removal fails stays listed, for `quinebox gc`."""
    for line in lines:
        remove = _sweeps.get(str(line.get("kind")))
        if remove is not None:
            with contextlib.suppress(Exception):
                remove(line)


def keeper_runs() -> bool:
    """Whether any keeper runs on this machine (by its name, whoever's it is): one may still be removing a lost holder's boxes."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/comm", "rb") as comm:
                if comm.read().strip() == NAME:
                    return True
        except OSError:
            continue
    return False


def _name_self() -> None:
    import ctypes

    ctypes.CDLL(None).prctl(PR_SET_NAME, NAME, 0, 0, 0)

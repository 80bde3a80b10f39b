"""Who a process is, so that a reused pid is never taken for it: its start time, an owner id, and whether it runs.

Boxes, unpacked images in use, pending approvals and run records all name the process that owns them as
`host:pid:start` (the kernel's start time in clock ticks). A pid alone is not an identity — the kernel hands it
out again — so every liveness check compares the start time too, here and nowhere else.
"""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path


def process_start_ticks(pid: int) -> str:
    """The kernel's start time of `pid`, so a reused pid is not mistaken for a live owner ("0" if none runs)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "0"
    return stat.rsplit(")", 1)[1].split()[19]


def user_name(uid: int) -> str:
    """The login name of `uid`, or the number itself where the passwd database has none (a container's uid)."""
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def owner_id(pid: int | None = None) -> str:
    """`host:pid:start` of this process (or of `pid`): whose boxes these are, checked by `gc`."""
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}:{pid}:{process_start_ticks(pid)}"


def owner_tag() -> str:
    """`PID-START` of this process, for naming what it leaves on disk (see state.cluster_dir)."""
    pid = os.getpid()
    return f"{pid}-{process_start_ticks(pid)}"


def owner_alive(owner: str, hostname: str | None = None) -> bool:
    """Is the `host:pid:start` process still running? Owners on other hosts are assumed alive."""
    host, pid, start = _parts(owner)
    if host != (hostname or socket.gethostname()):
        return True
    if not pid.isdigit():
        return False
    return pid_alive(int(pid), start)


def _parts(owner: str) -> tuple[str, str, str]:
    """`host:pid:start` as its three parts (each "" where it has none)."""
    host, _, rest = owner.partition(":")
    pid, _, start = rest.partition(":")
    return host, pid, start


def pid_alive(pid: int, start: str) -> bool:
    """Does `pid` run, as the process that started at `start`? A zombie has exited, whatever its pid says."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return process_start_ticks(pid) == start and not _zombie(pid)


def signal_owner(owner: str, signum: int) -> bool:
    """Send `signum` to the `host:pid:start` process of this host, held first by a pidfd and its start read again
    after, so that a pid handed out anew meanwhile is never signalled. Whether it was sent."""
    host, pid, start = _parts(owner)
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        pidfd = os.pidfd_open(int(pid))
    except OSError:
        return False
    try:
        if not pid_alive(int(pid), start):
            return False
        signal.pidfd_send_signal(pidfd, signum)
        return True
    except OSError:  # gone meanwhile, or not ours to signal
        return False
    finally:
        os.close(pidfd)


def reap_children() -> tuple[list[int], bool]:
    """Collect every child of this process that has exited: (their pids, whether a child still runs)."""
    reaped: list[int] = []
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped, False
        if pid == 0:
            return reaped, True
        reaped.append(pid)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int, signum: int = signal.SIGKILL) -> None:
    """Be sent `signum` when `parent` dies, however it dies (Linux's PR_SET_PDEATHSIG); gone already, go now. (A
    command server's workers and its pool's keeper: here, as what every process has imported, so that a worker's
    start imports nothing.)"""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signum)
    if os.getppid() != parent:
        os._exit(125)

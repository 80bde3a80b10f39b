"""What removes a quinebox process's runtime boxes when that process dies without removing them itself.

A box on an OCI runtime has no engine to remove it: its owner deletes it once it has exited. An owner killed by
SIGKILL cannot, so each owner forks one keeper, in a session of its own, the first time it starts such a box, and
tells it over a pipe which boxes it holds (a JSON line {"hold": ID, "bundle": …, "runtime": ARGV} before creating
one, {"release": ID} once it is deleted; each box names its runtime, as one process may use several). When
the pipe ends — the owner exited, however it died — the keeper kills and deletes whatever it still holds, removes
their bundles, and leaves. The box's lifeline would stop its processes too; the keeper also takes its cgroup
and runtime state.

Forked, not started anew: a new interpreter's start-up (~15 ms of CPU) would be paid by every `quinebox exec`.
The child keeps nothing of its owner's open but its end of the pipe, touches none of its owner's locks or
objects (system calls, a box root's detach among them, json, and `subprocess` for the runtime), and leaves with os._exit.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from quinebox.box.backends.oci.boxroot import remove_box

DEADLINE = 10.0
#: What /proc/PID/comm says of a keeper (a forked process otherwise looks like its owner).
NAME = b"quinebox-keeper"
PR_SET_NAME = 15
#: Signals a Python owner may have handlers for: a keeper takes the defaults (it has no owner's code to run).
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGWINCH, signal.SIGCHLD)


def start() -> tuple[int, int]:
    """A keeper for this process's boxes: (its pid, the fd to tell it on)."""
    told, tell = os.pipe()  # both close-on-exec: no runtime or box ever holds the keeper's pipe
    pid = os.fork()
    if pid == 0:  # the keeper
        try:
            os.setsid()  # the owner's terminal's signals are not for it
            os.chdir("/")  # holds no directory of the owner's busy
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
    return pid, tell


def keep(fd: int) -> None:
    """Follow the owner's lines on `fd` until it ends, then sweep what it still holds."""
    held: dict[str, tuple[list[str], str]] = {}
    pending = b""
    while chunk := os.read(fd, 65536):
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            try:
                told = json.loads(line)
                if "hold" in told:
                    held[str(told["hold"])] = ([str(a) for a in told["runtime"]], str(told.get("bundle") or ""))
                else:
                    held.pop(str(told.get("release")), None)
            except (ValueError, KeyError, TypeError, AttributeError):
                continue  # never from our owner; nothing to act on
    sweep(held)


def sweep(held: dict[str, tuple[list[str], str]]) -> None:
    """Kill and remove each box still held (a box's root its owner died before detaching included); one the
    runtime would not delete stays listed, for `quinebox gc`."""
    for cid, (runtime, bundle) in held.items():
        try:
            subprocess.run([*runtime, "kill", "--all", cid, "KILL"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=DEADLINE)
        except (OSError, subprocess.TimeoutExpired):
            pass
        remove_box(runtime, cid, Path(bundle) if bundle else None)


def keeper_runs() -> bool:
    """Whether any keeper runs on this machine (by its name, whoever's it is): one may still be removing a lost owner's boxes."""
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

"""A holder: a process of its own that makes a long-lived box, owns it, and ends it (`box create`, `Sandbox.detached`).

A box ends with its owner, so a box that outlives whoever asked for it needs an owner that outlives them: a
holder, in a session of its own, that makes the box (`make`: a Sandbox's constructor, from the front end), says
its id (or its one line of failure: "CODE words") on a pipe, and then waits over it until `box rm`, its TTL, its
idle limit with no exec running, or a SIGTERM. The CLI forks it (one thread, so a fork is safe); a library
process, which may run threads, starts it as a fresh interpreter (`spawn`), whose launcher forks the holder and
exits at once: no holder is left a zombie of its caller's.
"""

from __future__ import annotations

import math
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn, Protocol

from quinebox.box.live import freezing, sandboxes
from quinebox.errors import EXIT_QUINEBOX, QuineboxError

#: How long a spawned holder's launcher may take to import quinebox and fork the holder.
LAUNCH_TIMEOUT = 60.0
#: How long a holder may take to make its box (an image's pull included) and say its id.
TOLD_TIMEOUT = 900.0


class Held(Protocol):
    """What a holder holds: a Sandbox."""

    id: str

    @property
    def returncode(self) -> int | None: ...

    def close(self) -> None: ...


def hold(make: Callable[[], Held], idle: float | None, report: int) -> int:
    """The box's owner: made here, so it ends with this process; its id said on `report`, then waited over."""
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: stopping.append(signum))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        box = make()
    except QuineboxError as exc:
        os.write(report, f"{exc.exit_code} {exc}\n".encode(errors="replace"))
        return exc.exit_code
    os.write(report, f"id {box.id}\n".encode())
    os.close(report)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    made = time.time()
    try:
        while not stopping and box.returncode is None:
            time.sleep(0.2)
            if idle is not None and time.time() - sandboxes.used(box.id, made) > idle and not sandboxes.busy(box.id) and freezing.pause_of(box.id) is None:
                break
    finally:
        box.close()
    return 0


def fork(make: Callable[[], Held], idle: float | None) -> tuple[int, int]:
    """A holder forked from this (single-threaded) process: its pid, and the fd its report comes on (`told`)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the holder's life is checked from the outside (tests/e2e/test_sandboxes.py)
        os.close(read_end)
        os.setsid()
        _hold_and_exit(make, idle, write_end)
    os.close(write_end)
    return pid, read_end


def spawn(code: str, payload: bytes) -> int:
    """A holder started as a fresh interpreter running `code` (which reads `payload` on its stdin and calls
    `launched`), safe from a process with threads; the fd its report comes on (`told`, with no pid to wait for)."""
    read_end, write_end = os.pipe()
    here = str(Path(__file__).resolve().parents[3])  # where this very quinebox was found, however it was
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)}
    try:
        launcher = subprocess.Popen(
            [sys.executable, "-c", code, str(write_end)], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, pass_fds=(write_end,),
            start_new_session=True, close_fds=True, env=env,
        )
    except OSError as exc:
        os.close(read_end)
        raise QuineboxError(f"cannot start the box's holder ({sys.executable}): {exc.strerror or exc}") from None
    finally:
        os.close(write_end)
    try:
        launcher.communicate(payload, timeout=LAUNCH_TIMEOUT)
    except subprocess.TimeoutExpired:
        launcher.kill()
        launcher.wait()
        os.close(read_end)
        raise QuineboxError(f"the box's holder did not start within {LAUNCH_TIMEOUT:g} s ({sys.executable} importing quinebox)") from None
    return read_end


def launched(make: Callable[[], Held], idle: float | None, report: int) -> None:
    """In a spawned launcher: fork the holder and return at once (the launcher then exits, and is reaped by its caller)."""
    if os.fork() == 0:  # pragma: no cover - as in `fork`
        _hold_and_exit(make, idle, report)
    os.close(report)


def _hold_and_exit(make: Callable[[], Held], idle: float | None, report: int) -> NoReturn:
    """The forked holder's whole life: hold the box, then leave the process at once, whatever happened (never back
    into the forking caller's code)."""
    code = EXIT_QUINEBOX
    try:
        code = hold(make, idle, report)
    finally:
        os._exit(code)


def told(read_end: int, pid: int | None = None, timeout: float = TOLD_TIMEOUT) -> str:
    """The id the holder reports; its one line of failure as QuineboxError (its exit status as the error's). A holder
    that says nothing within `timeout` is QuineboxError too: killed when its pid is known; else its report's end is
    closed, so a holder that makes its box later cannot say so, fails, and its box goes with it."""
    deadline = time.monotonic() + timeout
    ready = select.poll()  # not select.select: a process with many sandboxes has fds past 1023
    ready.register(read_end, select.POLLIN)
    chunks: list[bytes] = []
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not ready.poll(math.ceil(left * 1000)):
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                raise QuineboxError(f"the box's holder did not say within {timeout:g} s whether it made the box (`quinebox box ls` shows the boxes there are)")
            if not (chunk := os.read(read_end, 65536)):
                break
            chunks.append(chunk)
    finally:
        os.close(read_end)
    said = b"".join(chunks).decode(errors="replace")
    if said.startswith("id "):
        return said[3:].strip()
    if pid is not None:
        os.waitpid(pid, 0)
    error = QuineboxError(said.partition(" ")[2].strip() if said[:3].isdigit() else said.strip() or "the box's holder ended before it made the box")
    error.exit_code = int(said[:3]) if said[:3].isdigit() else EXIT_QUINEBOX
    raise error

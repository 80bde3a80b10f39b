"""Timing one command the way every benchmark here does: wall time, exit status, peak RSS."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Iterator


@dataclass(frozen=True)
class Measured:
    seconds: float
    code: int
    peak_kib: int


#: How long one measured command may take before the benchmark stops (the engine here can wedge under load).
DEADLINE = 900.0


def run_child(
    argv: list[str],
    *,
    stdin: bytes | IO[bytes] | None = None,
    env: dict[str, str] | None = None,
    check: bool = True,
    stdout: IO[bytes] | None = None,
    deadline: float = DEADLINE,
) -> Measured:
    """Run `argv` with stdout discarded (or into `stdout`); `stdin` is bytes to feed, a file, or nothing.

    With `check`, a failure stops the benchmark with the command's last words:
    a figure from a failed run would be a lie. One that overruns `deadline` is killed and stops it too.
    """
    with tempfile.TemporaryFile() as err:
        began = time.perf_counter()
        feed = stdin if stdin is not None and not isinstance(stdin, bytes) else subprocess.PIPE if stdin else subprocess.DEVNULL
        proc = subprocess.Popen(argv, stdin=feed, stdout=stdout or subprocess.DEVNULL, stderr=err, env=env)
        if isinstance(stdin, bytes) and stdin:
            proc.stdin.write(stdin)
            proc.stdin.close()
        overran = threading.Event()
        timer = threading.Timer(deadline, lambda: (overran.set(), proc.kill()))
        timer.start()
        _, status, usage = os.wait4(proc.pid, 0)
        timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
        if overran.is_set():
            raise SystemExit(f"{' '.join(argv[:4])} … did not finish in {deadline:g} s: stopped, no figure made of it")
        measured = Measured(time.perf_counter() - began, os.waitstatus_to_exitcode(status), usage.ru_maxrss)
        if check and measured.code != 0:
            err.seek(0)
            raise SystemExit(f"{' '.join(argv[:4])} … exited {measured.code}: {err.read().decode(errors='replace')[-500:]}")
    return measured


def backend() -> str:
    """Where this run's boxes go ("oci (runc)", "bwrap" or "docker"), as `quinebox doctor` says (QUINEBOX_BACKEND, else
    auto): the targets differ, the Docker backend's alone being the engine's."""
    from quinebox.box.backends.choice import choose
    from quinebox.box.backends.registry import NAMES

    choice = choose(None, known=NAMES)
    return f"oci ({choice.runtime})" if choice.backend == "oci" else choice.backend


@contextlib.contextmanager
def served(pool: int | None) -> Iterator[dict[str, str] | None]:
    """With `pool` (warm boxes per shape): the environment of a state dir of its own with `quinebox serve --pool` on it,
    its default shape warm; without: None (the benchmark runs the CLI as it starts cold)."""
    if pool is None:
        yield None
        return
    quinebox = str(Path(sys.executable).with_name("quinebox"))
    state = tempfile.mkdtemp(prefix="quinebox-bench-state-")
    env = {**os.environ, "QUINEBOX_STATE_DIR": state}
    env["QUINEBOX_SERVE"] = "manual"
    env.pop("QUINEBOX_POOL", None)
    subprocess.run([quinebox, "serve", "--background", "--pool", str(pool)], env=env, check=True, capture_output=True, timeout=120)
    try:
        until = time.monotonic() + 120
        while pool and time.monotonic() < until:
            said = json.loads(subprocess.run([quinebox, "serve", "status", "--json"], env=env, capture_output=True, check=True, timeout=60).stdout)
            if any(shape["warm"] >= pool for shape in said["pool"]["shapes"]):
                break
            time.sleep(0.2)
        yield env
    finally:
        subprocess.run([quinebox, "serve", "stop"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(state, ignore_errors=True)

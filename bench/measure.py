"""Timing one command the way every benchmark here does: wall time, exit status, peak RSS."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import IO


@dataclass(frozen=True)
class Measured:
    seconds: float
    code: int
    peak_kib: int


def run_child(
    argv: list[str], *, stdin: bytes | IO[bytes] | None = None, env: dict[str, str] | None = None, check: bool = True, stdout: IO[bytes] | None = None
) -> Measured:
    """Run `argv` with stdout discarded (or into `stdout`); `stdin` is bytes to feed, a file, or nothing.

    With `check`, a failure stops the benchmark with the command's last words:
    a figure from a failed run would be a lie.
    """
    with tempfile.TemporaryFile() as err:
        began = time.perf_counter()
        feed = stdin if stdin is not None and not isinstance(stdin, bytes) else subprocess.PIPE if stdin else subprocess.DEVNULL
        proc = subprocess.Popen(argv, stdin=feed, stdout=stdout or subprocess.DEVNULL, stderr=err, env=env)
        if isinstance(stdin, bytes) and stdin:
            proc.stdin.write(stdin)
            proc.stdin.close()
        _, status, usage = os.wait4(proc.pid, 0)
        measured = Measured(time.perf_counter() - began, os.waitstatus_to_exitcode(status), usage.ru_maxrss)
        if check and measured.code != 0:
            err.seek(0)
            raise SystemExit(f"{' '.join(argv[:4])} … exited {measured.code}: {err.read().decode(errors='replace')[-500:]}")
    return measured

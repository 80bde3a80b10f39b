"""Whether CRIU works here: what runc (and the engine's `docker checkpoint`) checkpoint a box with.

`criu check` asks the kernel for everything CRIU needs; on this machine CRIU 3.17 stops at the kernel's vDSO
("Unexpected rt vDSO area bounds"), so no runc box can be checkpointed, whatever quinebox does. Asked once per
process, with a deadline, and said in one line: by a refused `box checkpoint` and by `quinebox doctor`.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess

#: The longest `criu check` may take (it probes the kernel; it never waits on anything).
CHECK_TIMEOUT = 10.0


@functools.cache
def criu_fails() -> str | None:
    """Why CRIU cannot checkpoint here, in a few words; None when `criu check` passes."""
    binary = shutil.which("criu") or next((path for path in ("/usr/sbin/criu", "/sbin/criu") if os.access(path, os.X_OK)), None)
    if binary is None:
        return "CRIU is not installed (`apt-get install criu`)"
    try:
        done = subprocess.run([binary, "check"], capture_output=True, timeout=CHECK_TIMEOUT)
    except subprocess.TimeoutExpired:
        return f"`criu check` did not answer within {CHECK_TIMEOUT:g} s"
    except OSError as exc:
        return f"cannot run {binary}: {exc.strerror}"
    if done.returncode == 0:
        return None
    said = (done.stdout + done.stderr).decode(errors="replace")
    errors = [line.split("): ", 1)[-1].strip() for line in said.splitlines() if line.startswith("Error")]
    return f"`criu check` fails on this kernel: {errors[0] if errors else said.strip()[:200] or f'exit status {done.returncode}'}"

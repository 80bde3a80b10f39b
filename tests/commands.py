"""Running the `quinebox` command as a user would, and writing scripted models for it."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

QUINEBOX = str(Path(sys.executable).with_name("quinebox"))
#: CI's pass as a user who is not root and may not use the engine (scripts/test.sh; tests/conftest.py).
ROOTLESS = os.environ.get("QUINEBOX_TEST_ROOTLESS") == "1"
#: The uid a box's command runs as: the agent image's user when root makes the box; in a rootless box (CI's
#: pass as a user who is not root) its namespace's uid 0, which is the caller (oci.policy.Rootless).
BOX_UID = 0 if ROOTLESS else 1000


def qb(*args: str, input: bytes = b"", cwd=None, env=None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([QUINEBOX, *args], input=input, capture_output=True, cwd=cwd, env=env, timeout=timeout)


def scripts(directory: Path, **files: list) -> Path:
    """One scripted model per keyword: NAME.yaml holding those turns."""
    for name, turns in files.items():
        (directory / f"{name}.yaml").write_text(json.dumps({"turns": turns}))
    return directory


def wait_for(predicate, timeout: float = 60.0, every: float = 0.1, what: str = "the condition"):
    """`predicate()`'s first true value, asked every `every` seconds; AssertionError after `timeout`."""
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"{what} did not hold within {timeout:g} s")

"""Running the `quinebox` command as a user would, and writing scripted models for it."""

import json
import subprocess
import sys
from pathlib import Path

QUINEBOX = str(Path(sys.executable).with_name("quinebox"))


def qb(*args: str, input: bytes = b"", cwd=None, env=None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([QUINEBOX, *args], input=input, capture_output=True, cwd=cwd, env=env, timeout=timeout)


def scripts(directory: Path, **files: list) -> Path:
    """One scripted model per keyword: NAME.yaml holding those turns."""
    for name, turns in files.items():
        (directory / f"{name}.yaml").write_text(json.dumps({"turns": turns}))
    return directory

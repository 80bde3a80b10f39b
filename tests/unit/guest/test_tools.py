"""The guest's sh tool on commands the kernel will not run: the model hears why, the agent loop goes on.

tools.py is run as a box runs it: flat, from the guest's own directory, in an interpreter of its own."""

import json
import os
import subprocess
import sys

import pytest

from quinebox.resources import guest_dir

PROBE = "import json, sys; import tools; print(json.dumps(tools.run_sh(sys.stdin.read(), 5)))"


def run_sh(command: str) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(guest_dir())!r}); {PROBE}"],
                          input=command.encode(), capture_output=True, timeout=30, env={**os.environ, "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr.decode()
    code, result = json.loads(done.stdout)
    return code, result


@pytest.mark.parametrize(
    ("command", "why"),
    [
        ("echo " + "x" * 200_000, "Argument list too long"),  # one argument past MAX_ARG_STRLEN (128 KiB)
        ("echo a\0b", "embedded null byte"),
    ],
)
def test_a_command_the_kernel_refuses_is_a_tool_error_not_a_crash(command, why):
    code, result = run_sh(command)
    assert code == 126
    assert result.startswith("error: the command cannot be run (") and why in result
    assert f"it is {len(command.encode())} bytes" in result


def test_an_ordinary_command_still_runs():
    code, result = run_sh("echo hi; exit 3")
    assert code == 3 and result.startswith("exit code 3\n") and "hi" in result

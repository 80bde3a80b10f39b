"""quinebox's failures on the command line: one line and an exit code; `--traceback` (or QUINEBOX_TRACEBACK=1) adds the
whole chain before that line, `raise ... from None`'s hidden context included; a bug is never said as quinebox's error."""

import os
import subprocess
import sys

import pytest
from commands import QUINEBOX

from quinebox.cli.app import chain
from quinebox.errors import ErrorKind, GrantError, QuineboxError

BAD_DURATION = "bad duration 'bogus': use seconds or a unit ms, s, m, h or d (e.g. 30, 30s, 5m, 7d)"
LINE = f"quinebox: --older-than: {BAD_DURATION}\n"


def quinebox(*args: str, traceback_env: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "QUINEBOX_TRACEBACK"}
    if traceback_env is not None:
        env["QUINEBOX_TRACEBACK"] = traceback_env
    return subprocess.run([QUINEBOX, *args], capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.parametrize("env", [None, "0", ""])
def test_without_traceback_a_failure_is_one_line_and_its_exit_code(env):
    done = quinebox("prune", "--older-than", "bogus", traceback_env=env)
    assert (done.returncode, done.stderr, done.stdout) == (2, LINE, "")


@pytest.mark.parametrize(("args", "env"), [(("--traceback",), None), ((), "1")], ids=["--traceback", "QUINEBOX_TRACEBACK=1"])
def test_traceback_prints_the_whole_chain_then_the_one_line(args, env):
    # agents.py raises the RulesError `from None`: Python's own traceback would hide the GrantError it came from.
    done = quinebox(*args, "prune", "--older-than", "bogus", traceback_env=env)
    assert done.returncode == 2
    assert done.stderr.endswith(LINE)
    first, _, then = done.stderr.partition("\nDuring handling of the above exception, another exception occurred:\n")
    assert then, done.stderr
    assert first.startswith("Traceback (most recent call last):\n")
    assert f"quinebox.errors.GrantError: {BAD_DURATION}\n(kind=bad_grant, value='bogus')\n" in first
    assert 'in parse_duration\n' in first
    assert f"quinebox.tree.prune.RulesError: --older-than: {BAD_DURATION}\n(kind=bad_input)\n" in then
    assert done.stderr.count("Traceback (most recent call last):") == 2


def test_traceback_goes_with_a_command_that_registers_only_itself():
    """`--traceback` before the command still names the command (cli/__init__.py registers only it)."""
    done = quinebox("--traceback", "exec", "-g", "mem:lots", "--", "true")
    assert done.returncode == 125
    assert done.stderr.endswith("quinebox: bad grant 'mem:lots': bad size 'lots': use a number with an optional unit k, m, g or t (e.g. 128m, 2g)\n")
    assert "quinebox.errors.GrantError: bad size 'lots': use a number with an optional unit k, m, g or t (e.g. 128m, 2g)\n(kind=bad_grant, value='lots')\n" in done.stderr
    assert "(kind=bad_grant, grant='mem:lots')\nquinebox: bad grant 'mem:lots'" in done.stderr


def test_box_rm_says_a_bug_in_find_as_itself_not_as_a_missing_box(tmp_path):
    """A bug inside `find` (here: one put there) reaches the user as that bug, with its traceback; never a line of quinebox's."""
    probe = (
        "import sys\n"
        "import quinebox.box.live.sandboxes as sandboxes\n"
        "def find(ref, backend=None):\n"
        "    raise KeyError('a bug in find')\n"
        "sandboxes.find = find\n"
        "sys.argv = ['quinebox', 'box', 'rm', 'somebox']\n"
        "from quinebox.cli import main\n"
        "main()\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env={**os.environ, "QUINEBOX_STATE_DIR": str(tmp_path)})
    assert done.returncode == 1, done.stderr
    assert "quinebox:" not in done.stderr
    assert done.stderr.rstrip().endswith("KeyError: 'a bug in find'")


def test_box_rm_says_each_missing_box_and_goes_on(tmp_path, monkeypatch):
    """A real missing box is quinebox's NOT_FOUND: said in one line (its own), and `box rm` goes on with the next one."""
    from quinebox.box.live import sandboxes

    monkeypatch.setenv("QUINEBOX_STATE_DIR", str(tmp_path))
    with pytest.raises(QuineboxError) as missing:
        sandboxes.find("h4-no-such-box")
    assert (missing.value.kind, missing.value.fields) == (ErrorKind.NOT_FOUND, {"ref": "h4-no-such-box"})
    done = subprocess.run([QUINEBOX, "box", "rm", "h4-no-such-box", "h4-nor-this"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "QUINEBOX_STATE_DIR": str(tmp_path)})
    assert done.returncode == 125
    assert [line.split(" is named ")[1] for line in done.stderr.splitlines()] == [
        "'h4-no-such-box' or has an id starting so: `quinebox box ls` lists them", "'h4-nor-this' or has an id starting so: `quinebox box ls` lists them",
    ]


def test_the_chain_is_first_cause_first_through_from_and_from_none():
    def raising():
        try:
            try:
                raise OSError(5, "I/O error")
            except OSError as exc:
                raise GrantError("middle") from exc
        except GrantError:
            raise QuineboxError("last") from None

    with pytest.raises(QuineboxError) as caught:
        raising()
    assert [type(e).__name__ for e in chain(caught.value)] == ["OSError", "GrantError", "QuineboxError"]


def test_a_chain_that_loops_ends():
    a, b = QuineboxError("a"), QuineboxError("b")
    a.__context__, b.__context__ = b, a
    assert chain(a) == [b, a]

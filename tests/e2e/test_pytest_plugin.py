"""The pytest plugin as another project uses it: a test file of its own, run by pytest in a subprocess."""

import os
import subprocess
import sys

from commands import BOX_UID

SUITE = '''
import pytest

def test_box_per_test(quinebox_sandbox):
    assert quinebox_sandbox.exec(["id", "-u"]).stdout == b"BOX_UID\\n"

@pytest.mark.quinebox(grants=["env:FROM_MARK=yes"])
def test_marked(quinebox_sandbox):
    assert quinebox_sandbox.exec(["sh", "-c", "echo $FROM_MARK $FROM_OPTION"]).stdout == b"yes set\\n"

def test_session_box_keeps_state_1(quinebox_session_sandbox):
    quinebox_session_sandbox.write_file("/world/left", b"by the first")

def test_session_box_keeps_state_2(quinebox_session_sandbox):
    assert quinebox_session_sandbox.read_file("/world/left") == b"by the first"
'''


def run_suite(tmp_path, *options, ci=None):
    (tmp_path / "test_theirs.py").write_text(SUITE.replace("BOX_UID", str(BOX_UID)))
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", str(tmp_path / "test_theirs.py"), *options],
        capture_output=True, env=env, cwd=tmp_path, timeout=300,
    )


def test_fixtures_options_and_marks(tmp_path):
    done = run_suite(tmp_path, "--quinebox-grant", "env:FROM_OPTION=set")
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
    assert b"4 passed" in done.stdout


def test_no_box_skips_with_the_reason_or_fails_under_ci(tmp_path):
    skipped = run_suite(tmp_path, "--quinebox-grant", "rw:/etc", "-k", "per_test")
    assert skipped.returncode == 0 and b"1 skipped" in skipped.stdout
    assert b"quinebox could not start a box" in skipped.stdout and b"/etc" in skipped.stdout
    failed = run_suite(tmp_path, "--quinebox-grant", "rw:/etc", "-k", "per_test", ci="true")
    assert failed.returncode == 1 and b"1 error" in failed.stdout and b"quinebox could not start a box" in failed.stdout

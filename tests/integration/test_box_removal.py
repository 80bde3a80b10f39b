"""A box whose removal fails is never reported as removed: it stays listed, and the next `gc` removes it.

The runtime here is runc behind a stub of a few lines that, while a marker file says so, refuses `delete` (or
hangs in it past the deadline), as a wedged or busy runtime would: real processes, a real box, a real keeper.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import quinebox
from quinebox.box.backends.oci import runtime as oci
from quinebox.box.backends.oci.boxroot import bundle_of
from quinebox.box.backends.oci.listed import runtime_boxes
from quinebox.box.owners.gc import collect_garbage
from quinebox.state import state_dir

QUINEBOX = str(Path(sys.executable).with_name("quinebox"))
STUB = """#!/bin/sh
for word in "$@"; do
  if [ "$word" = delete ] && [ -e {marker} ]; then
    if [ "$(cat {marker})" = hang ]; then exec sleep 30; fi
    echo "container is busy" >&2; exit 1
  fi
done
exec {runc} "$@"
"""


@pytest.fixture
def stuck(tmp_path, monkeypatch):
    """(the stub runtime's marker file, its name): boxes run on runc through the stub, found on PATH by its name."""
    runc = subprocess.run(["sh", "-c", "command -v runc"], capture_output=True, text=True, check=True).stdout.strip()
    marker = tmp_path / "refuse"
    stub = tmp_path / "stuckrunc"
    stub.write_text(STUB.format(marker=marker, runc=runc))
    stub.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("QUINEBOX_BACKEND", "oci")
    monkeypatch.setenv("QUINEBOX_RUNTIME", "stuckrunc")
    quinebox.exec(["true"])  # the agent image unpacked, and the stub probed, before any delete is refused
    yield marker, runc
    marker.unlink(missing_ok=True)
    root = str(state_dir() / "oci" / "stuckrunc")
    for box in runtime_boxes():
        if box.backend == "stuckrunc":  # what a failed test left: removed with runc itself
            subprocess.run([runc, "--root", root, "delete", "--force", box.id], capture_output=True, timeout=10)


def orphan(marker: Path) -> str:
    """A box whose owner was SIGKILLed while deletes are refused: its keeper killed it but could not remove it."""
    script = "import sys, quinebox\np = quinebox.Popen(['sleep', '300'])\nprint(p.session, flush=True)\nsys.stdin.read()\n"
    owner = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        session = owner.stdout.readline().decode().strip()
        assert session
        marker.write_text("refuse")
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    deadline = time.monotonic() + 20
    while [box.state for box in listed(session)] != ["stopped"] and time.monotonic() < deadline:
        time.sleep(0.05)  # the keeper kills it (its lifeline too), then its delete is refused
    time.sleep(0.5)  # the keeper's refused delete and its state check are done by then
    return session


def listed(session: str) -> list:
    return [box for box in runtime_boxes() if box.session == session]


def test_a_refused_or_hung_delete_is_not_reported_as_a_removal(stuck, monkeypatch):
    marker, _ = stuck
    session = orphan(marker)
    assert [box.state for box in listed(session)] == ["stopped"]
    assert bundle_of(session).is_dir()  # the keeper's removal failed: its remains are kept with it

    marker.write_text("hang")  # the runtime now hangs in delete, past the (shortened) deadline
    monkeypatch.setattr(oci, "QUICK_TIMEOUT", 1.0)
    said: list[tuple[str, str]] = []
    began = time.monotonic()
    removed = collect_garbage(unremoved=lambda s, why: said.append((s, why)))
    assert session not in removed
    assert [s for s, _ in said] == [session] and "did not answer in time" in said[0][1]
    assert time.monotonic() - began < 10
    assert len(listed(session)) == 1 and bundle_of(session).is_dir()

    marker.write_text("refuse")  # `quinebox gc` says so in one line, and counts it as nothing removed
    done = subprocess.run([QUINEBOX, "gc"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = (done.stdout + done.stderr).splitlines()
    assert [line for line in lines if session in line] == [f"quinebox: did not remove box {session}: its backend (stuckrunc) refused to remove it or did not answer in time; it stays listed for the next `quinebox gc`"]
    assert len(listed(session)) == 1

    marker.unlink()  # the runtime answers again: the next gc removes it, remains and all
    assert session in collect_garbage()
    assert listed(session) == [] and not bundle_of(session).exists()

"""`quinebox doctor` finds the agent image where `exec` finds it, with no engine to ask: in the machine's shared
image cache, which root fills (`quinebox image share`, quinebox/box/images/shared.py; scripts/setup.sh does); and
where it is nowhere, it names the fix that works for whoever runs it.

As root here (the engine pointed away), and as a plain user with no engine at all in CI's rootless pass (tests/e2e
is in its list): the user whose boxes ran from the shared cache while doctor said the image "is not here".
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from quinebox.box.images import shared
from quinebox.box.spec import DEFAULT_IMAGE

QUINEBOX = str(Path(sys.executable).with_name("quinebox"))
NO_ENGINE = "unix:///nonexistent/docker.sock"


def without_engine(state: Path, **settings: str) -> dict:
    """This environment with no engine to ask, a state dir of its own (nothing unpacked in it), the machine's shared
    cache unless `settings` names another, and the default backend (a pass of scripts/test.sh may pin one)."""
    env = {k: v for k, v in os.environ.items() if k not in ("QUINEBOX_BACKEND", "QUINEBOX_RUNTIME", "QUINEBOX_SHARED_IMAGES")}
    return {**env, "DOCKER_HOST": NO_ENGINE, "QUINEBOX_STATE_DIR": str(state), **settings}


def image_line(env: dict) -> tuple[int, str]:
    """doctor's exit status, and its line on the agent image with the fix under it."""
    done = subprocess.run([QUINEBOX, "doctor"], capture_output=True, timeout=120, env=env)
    lines = done.stderr.decode().splitlines()
    for i, text in enumerate(lines):
        if text[5:].startswith(f"image {DEFAULT_IMAGE}"):
            return done.returncode, "\n".join(lines[i : i + 2] if i + 1 < len(lines) and lines[i + 1].startswith("      → ") else [text])
    raise AssertionError("doctor said nothing of the agent image:\n" + "\n".join(lines))


@pytest.fixture
def shared_image(monkeypatch) -> str:
    """The agent image's tree in the machine's shared cache, which setup fills."""
    monkeypatch.delenv("QUINEBOX_SHARED_IMAGES", raising=False)
    public = shared.lookup(DEFAULT_IMAGE)
    if public is None:
        pytest.fail(f"{DEFAULT_IMAGE} is not in the shared image cache {shared.DEFAULT_ROOT}: run `sudo quinebox image share` (scripts/setup.sh does)", pytrace=False)
    return public[1]


def test_doctor_finds_the_agent_image_in_the_shared_cache_where_exec_does(shared_image, tmp_path):
    env = without_engine(tmp_path / "state")
    code, said = image_line(env)
    assert (code, said) == (0, f"ok   image {DEFAULT_IMAGE} in the machine's shared image cache ({shared_image}; copied into yours on first use)")
    ran = subprocess.run([QUINEBOX, "exec", "--", "true"], capture_output=True, timeout=120, env=env)
    assert ran.returncode == 0, ran.stderr  # and exec finds it there too
    code, said = image_line(env)
    assert code == 0 and said.startswith(f"ok   image {DEFAULT_IMAGE} unpacked for OCI boxes ({tmp_path / 'state'}/"), said  # now this user's own copy


def test_doctor_names_the_fix_that_works_for_whoever_runs_it_when_the_image_is_nowhere(tmp_path):
    (tmp_path / "empty").mkdir()
    env = without_engine(tmp_path / "state", QUINEBOX_SHARED_IMAGES=str(tmp_path / "empty"))
    code, said = image_line(env)
    assert code == 1
    head, fix = said.split("\n      → ")
    assert head == f"FAIL image {DEFAULT_IMAGE} is not here (not unpacked, not in the shared image cache {tmp_path / 'empty'}, and no engine to ask)"
    if os.geteuid() == 0:  # root builds it (with the engine), or loads a saved one
        assert "quinebox image build" in fix and "quinebox image load FILE" in fix, fix
    else:  # a plain user can do neither: root shares it
        assert fix == f"have root share it: sudo quinebox image share {DEFAULT_IMAGE}"
    ran = subprocess.run([QUINEBOX, "exec", "--", "true"], capture_output=True, timeout=120, env=env)
    assert ran.returncode == 125 and b"sudo quinebox image share" in ran.stderr, ran.stderr  # where exec, too, says to look

"""A bwrap box's seccomp program is compiled once per process and kept in the state dir (bwrap/programs.py): a later
process's box loads the kept program without importing pyseccomp or compiling; a kept file that is not whole, not
this user's, or a link is never used or written through; anything the program is made of, changed, names another."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from bwrap_argv import bwrap
from test_policy import spec

from quinebox.box.backends.bwrap import programs
from quinebox.box.backends.bwrap.policy import compile_seccomp


def profile(*grants: str) -> dict:
    """A box's seccomp profile as bwrap_box renders it (test_policy_bwrap.py's)."""
    return bwrap(spec(*grants)).seccomp


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A state dir of the test's own, and a process with nothing compiled yet."""
    monkeypatch.setenv("QUINEBOX_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(programs, "_programs", {})
    return tmp_path / "state"


def kept(state: Path) -> list[Path]:
    return sorted((state / "seccomp").iterdir()) if (state / "seccomp").is_dir() else []


def test_a_profile_is_compiled_once_per_process_whatever_the_order_of_its_keys(state):
    plain, writes = profile(), profile("rw:/src=/work")
    first = programs.seccomp_program(plain)
    assert first == compile_seccomp(plain)
    assert programs.seccomp_program(dict(reversed(list(plain.items())))) is first
    assert programs.seccomp_program(writes) == compile_seccomp(writes) != first
    assert len(kept(state)) == 2


def test_a_program_is_kept_in_the_state_dir_as_this_users_file_alone(state):
    program = programs.seccomp_program(profile(), (1000, 1000))
    [path] = kept(state)
    assert path.read_bytes() == program and len(program) % 8 == 0
    info = path.stat()
    assert (info.st_mode & 0o777, info.st_uid) == (0o600, os.geteuid())
    assert (state / "seccomp").stat().st_mode & 0o077 == 0
    programs.seccomp_program(profile(), (1001, 1001))  # narrowed to other ids: a program of its own
    assert len(kept(state)) == 2


LATER = """
import sys
from quinebox.box.backends.bwrap import policy, programs
profile = eval(sys.stdin.read())
program = programs.seccomp_program(profile, (1000, 1000))
sys.stdout.write(f"{'pyseccomp' in sys.modules} {program.hex()}")
"""


def test_a_later_process_loads_the_kept_program_and_imports_no_pyseccomp(state):
    """The point of keeping it: a cold command's box neither imports pyseccomp (two `ldconfig -p`) nor compiles."""
    compiled = programs.seccomp_program(profile(), (1000, 1000))
    env = {**os.environ, "QUINEBOX_STATE_DIR": str(state)}
    later = subprocess.run([sys.executable, "-c", LATER], input=repr(profile()).encode(), capture_output=True, env=env, timeout=60)
    assert later.returncode == 0, later.stderr
    assert later.stdout.decode() == f"False {compiled.hex()}"
    for path in kept(state):
        path.unlink()
    fresh = subprocess.run([sys.executable, "-c", LATER], input=repr(profile()).encode(), capture_output=True, env=env, timeout=60)
    assert fresh.stdout.decode() == f"True {compiled.hex()}"  # none kept: compiled, the same program, and kept again
    assert len(kept(state)) == 1


@pytest.mark.parametrize("bad", [b"", b"\x00" * 13, "link"])
def test_a_kept_file_that_is_not_whole_or_is_a_link_is_compiled_again_and_replaced(state, tmp_path, bad):
    program = programs.seccomp_program(profile())
    [path] = kept(state)
    target = tmp_path / "elsewhere"
    target.write_bytes(b"\x06\x00\x00\x00\x00\x00\xff\x7f")  # one instruction: SECCOMP_RET_ALLOW, everything allowed
    path.unlink()
    if bad == "link":
        path.symlink_to(target)
    else:
        path.write_bytes(bad)
    programs._programs.clear()
    assert programs.seccomp_program(profile()) == program
    assert not path.is_symlink() and path.read_bytes() == program
    assert target.read_bytes() == b"\x06\x00\x00\x00\x00\x00\xff\x7f"  # never written through


@pytest.mark.root_only
def test_a_kept_file_another_user_owns_is_never_loaded(state):
    program = programs.seccomp_program(profile())
    [path] = kept(state)
    path.write_bytes(b"\x06\x00\x00\x00\x00\x00\xff\x7f")
    os.chown(path, 65534, 65534)
    programs._programs.clear()
    assert programs.seccomp_program(profile()) == program
    assert path.stat().st_uid == os.geteuid() and path.read_bytes() == program


def test_what_the_program_is_made_of_changed_names_another(state, tmp_path, monkeypatch: pytest.MonkeyPatch):
    """The dynamic linker's cache stands for libseccomp (ldconfig runs when it is installed or upgraded)."""
    cache = tmp_path / "ld.so.cache"
    cache.write_bytes(b"one")
    monkeypatch.setattr(programs, "_INPUTS", (*programs._INPUTS[:2], str(cache)))
    programs.seccomp_program(profile())
    cache.write_bytes(b"three")
    programs._programs.clear()
    programs.seccomp_program(profile())
    assert len(kept(state)) == 2


def test_a_state_dir_it_cannot_write_keeps_nothing_and_the_box_gets_its_program(state):
    state.mkdir(mode=0o700)
    (state / "seccomp").write_bytes(b"")  # a file where the directory would be
    assert programs.seccomp_program(profile()) == compile_seccomp(profile())
    assert [p.name for p in state.iterdir()] == ["seccomp"]

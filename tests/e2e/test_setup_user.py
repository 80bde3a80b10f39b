"""`quinebox setup-user NAME` delegates a cgroup the way systemd's Delegate= does (issue 52): the user may make
its boxes' cgroups below it and move processes into them, and nothing more — its own limits and weights against
the rest of the machine stay root's. Checked on the machine's real v1 hierarchies, as a real user, by the kernel."""

import os
import pwd
import subprocess
import uuid
from pathlib import Path

import pytest
from commands import QUINEBOX

from quinebox.box.backends.rootless import delegated_name, local_hierarchy, v1_hierarchies

pytestmark = [pytest.mark.root_only, pytest.mark.skipif(local_hierarchy() == "v2", reason="on cgroup v2 systemd delegates; setup-user makes nothing")]


@pytest.fixture
def user():
    name = f"qbd{uuid.uuid4().hex[:6]}"
    subprocess.run(["useradd", "--user-group", "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", name], check=True, timeout=60)
    entry = pwd.getpwnam(name)
    try:
        yield entry
    finally:
        for base in v1_hierarchies():
            path = base / delegated_name(entry.pw_uid)
            for child in (path / "box",):
                if child.is_dir():
                    child.rmdir()
            if path.is_dir():
                path.rmdir()
        subprocess.run(["userdel", name], check=False, timeout=60)


def as_user(entry, *argv: str) -> subprocess.CompletedProcess:
    def drop() -> None:
        os.setgroups([])
        os.setgid(entry.pw_gid)
        os.setuid(entry.pw_uid)

    return subprocess.run(list(argv), preexec_fn=drop, capture_output=True, text=True, timeout=60, cwd="/")


def test_setup_user_delegates_the_subtree_and_keeps_its_limits_roots(user):
    done = subprocess.run([QUINEBOX, "setup-user", user.pw_name], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"delegated to {user.pw_name} (uid {user.pw_uid})" in done.stderr
    hierarchies = [base / delegated_name(user.pw_uid) for base in v1_hierarchies()]
    assert {path.parent.name for path in hierarchies} >= {"memory", "pids", "cpu"} or {path.parent.name for path in hierarchies} >= {"memory", "pids", "cpu,cpuacct"}
    for path in hierarchies:
        assert (path.stat().st_uid, path.stat().st_gid) == (user.pw_uid, user.pw_gid), path
        for entry in path.iterdir():
            owner = entry.stat().st_uid
            if entry.name in ("cgroup.procs", "tasks"):
                assert owner == user.pw_uid, entry
            else:
                assert owner == 0, f"{entry} is the user's: a delegated user sets no limit of the subtree's own"
    memory = next(path for path in hierarchies if path.parent.name == "memory")
    cpu = next(path for path in hierarchies if (path / "cpu.shares").exists())
    # The kernel refuses the user the subtree's own weight and limit …
    refused = as_user(user, "sh", "-c", f"echo 262144 > {cpu}/cpu.shares; echo 1 > {memory}/memory.limit_in_bytes")
    assert refused.returncode != 0 and refused.stderr.count("Permission denied") == 2, refused
    assert (cpu / "cpu.shares").read_text().strip() != "262144"
    # … and lets it make a box's cgroup below, limit it, and move itself in.
    made = as_user(user, "sh", "-c", f"mkdir {memory}/box && echo 33554432 > {memory}/box/memory.limit_in_bytes && echo $$ > {memory}/box/cgroup.procs && echo ok")
    assert (made.returncode, made.stdout) == (0, "ok\n"), made
    assert Path(memory / "box" / "memory.limit_in_bytes").read_text().strip() == "33554432"


def test_setup_user_again_takes_back_what_an_older_setup_gave_away(user):
    """Before issue 52 every file of the subtree was chowned to the user: setup-user run again gives them back."""
    first = subprocess.run([QUINEBOX, "setup-user", user.pw_name], capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    memory = next(base / delegated_name(user.pw_uid) for base in v1_hierarchies() if base.name == "memory")
    os.chown(memory / "memory.limit_in_bytes", user.pw_uid, user.pw_gid)  # as the old setup-user left it
    again = subprocess.run([QUINEBOX, "setup-user", user.pw_name], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    assert (memory / "memory.limit_in_bytes").stat().st_uid == 0

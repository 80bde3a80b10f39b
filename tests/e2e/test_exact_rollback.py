"""Rollback is exact for every kind of entry a box can make: restore_world, adopt (by the host and in the box) and fork --at.

Each case makes the same entries in a real box — a FIFO, a socket, a file made
unreadable, a directory made unsearchable, and a device node attempted — then
checks the world on the host, as root sees it, against what it must be.
"""

import json
import os
import stat

import pytest
from commands import qb, scripts

from quinebox.agent.store import read_tape
from quinebox.state import session_dir

pytestmark = pytest.mark.root_only  # it reads boxes' worlds as root on the host (owners, device nodes)

TREE = ["-g", "spawn:4", "-g", "depth:1"]
SOCKET = 'python3 -c "import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])"'


def make(prefix: str) -> str:
    return (
        f"umask 022; mkfifo {prefix}_fifo; chmod 640 {prefix}_fifo; {SOCKET} {prefix}_sock; "
        f"echo mine > {prefix}_file; chmod 000 {prefix}_file; "
        f"mkdir {prefix}_dir; echo in > {prefix}_dir/inside; chmod 000 {prefix}_dir; "
        f"mknod {prefix}_dev c 1 3 2>/dev/null || echo {prefix}_dev refused >&4"
    )


def remove(prefix: str) -> str:
    return f"chmod 700 {prefix}_dir; rm -rf {prefix}_fifo {prefix}_sock {prefix}_file {prefix}_dir"


def made(prefix: str) -> dict:
    """What `make(prefix)` leaves: kind, mode and bytes of each entry."""
    return {
        f"{prefix}_fifo": ("p", 0o640, None),
        f"{prefix}_sock": ("s", 0o755, None),
        f"{prefix}_file": ("f", 0, b"mine\n"),
        f"{prefix}_dir": ("d", 0, None),
        f"{prefix}_dir/inside": ("f", 0o644, b"in\n"),
    }


KIND = {stat.S_IFIFO: "p", stat.S_IFSOCK: "s", stat.S_IFREG: "f", stat.S_IFDIR: "d", stat.S_IFLNK: "l", stat.S_IFCHR: "c", stat.S_IFBLK: "b"}


def on_host(session: str) -> dict:
    """The session's world as root reads it on the host, without quinebox's own code."""
    root = session_dir(session) / "world" / "tree"
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            kind = KIND[stat.S_IFMT(st.st_mode)]
            found[os.path.relpath(path, root)] = (kind, stat.S_IMODE(st.st_mode), open(path, "rb").read() if kind == "f" else None)
    return found


def run_script(tmp_path, turns, *args, env=None):
    scripts(tmp_path, mission=turns)
    done = qb("run", "-q", "--json", "-m", f"script:{tmp_path / 'mission.yaml'}", *args, "the mission", env=env)
    assert done.returncode == 0, done.stderr
    return done, json.loads(done.stderr.decode().splitlines()[-1])["session"]


def tool_result(session: str, name: str) -> str:
    [result] = [r["result"] for r in read_tape(session) if r["kind"] == "tool" and r["name"] == name]
    return result


@pytest.fixture(autouse=True)
def as_root():
    if os.getuid() != 0:
        pytest.fail("these tests read a box's world as root on the host: run the suite as root, as CI does", pytrace=False)


def test_restore_world_undoes_every_kind_of_entry_and_brings_each_back(tmp_path):
    done, session = run_script(
        tmp_path,
        [{"sh": make("keep")}, {"sh": f"{remove('keep')}; {make('new')}"}, {"tool": "restore_world", "args": {"revision": 1}}, {"exit": "success"}],
    )
    assert done.stdout == b"keep_dev refused\nnew_dev refused\n"  # no box may make a device node
    assert on_host(session) == made("keep")
    result = tool_result(session, "restore_world")
    assert "Could not restore" not in result and "removed new_fifo (made after revision 1)" in result and "brought back keep_sock" in result


def test_restore_world_says_what_it_could_not_bring_back(tmp_path):
    turns = [{"sh": "head -c 5000 /dev/zero > big; echo small > small"}, {"sh": "rm big small"}, {"tool": "restore_world", "args": {"revision": 1}}, {"exit": "success"}]
    _, session = run_script(tmp_path, turns, env={**os.environ, "QUINEBOX_WORLD_MAX_FILE": "1000"})
    assert on_host(session) == {"small": ("f", 0o644, b"small\n")}
    result = tool_result(session, "restore_world")
    assert "Could not restore: big: its bytes were not kept: larger than QUINEBOX_WORLD_MAX_FILE" in result


def test_fork_at_a_turn_rebuilds_every_kind_of_entry_as_it_was(tmp_path):
    _, original = run_script(tmp_path, [{"sh": make("keep")}, {"sh": f"{remove('keep')}; {make('new')}"}, {"exit": "success"}])
    scripts(tmp_path, forked=[{"exit": "success"}])
    done = qb("fork", original, "--at", "2", "-m", f"script:{tmp_path / 'forked.yaml'}", "-q", "--json")
    assert done.returncode == 0, done.stderr
    forked = json.loads(done.stderr.decode().splitlines()[-1])["session"]
    assert on_host(forked) == made("keep")
    assert on_host(original) == made("new")  # the original is untouched


def test_the_host_adopts_every_kind_of_entry_a_child_made_and_removes_what_it_removed(tmp_path):
    child = f"quinebox exec -- sh -c 'cd /world; {remove('keep')}; {make('new')}'"
    done, session = run_script(tmp_path, [{"sh": make("keep")}, {"sh": child}, {"exit": "success"}], *TREE)
    [kid] = [r["child"] for r in read_tape(session) if r["kind"] == "spawn"]
    adopted = qb("world", "adopt", kid)
    assert adopted.returncode == 0, adopted.stderr
    assert b"could not adopt" not in adopted.stderr
    assert on_host(session) == made("new")


def test_an_agent_adopts_every_kind_of_entry_its_child_made_inside_its_box(tmp_path):
    scripts(tmp_path, child=[{"sh": f"{remove('keep')}; {make('new')}"}, {"exit": "success"}])
    race = {"mode": "race", "adopt": True, "children": [{"mission": "change it all", "model": "script:child.yaml"}]}
    done, session = run_script(tmp_path, [{"sh": make("keep")}, {"fork": race}, {"exit": "success"}], *TREE)
    assert on_host(session) == made("new")
    assert "could not write" not in tool_result(session, "fork")

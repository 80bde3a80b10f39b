"""The boxes' keeper (box/backends/keeper.py) on real processes, with a kind of box whose removal writes a line: one
keeper for a process and the children it forks, what a dead holder held removed while the others' stays, a release
never removed again, the rest when every writer is gone, and a kind registered after the keeper was forked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from commands import wait_for

PROLOGUE = textwrap.dedent("""
    import os, sys, time
    from quinebox.box.backends import keeper
    out = sys.argv[1]

    def swept(line):
        with open(out, "a") as f:
            f.write(line["kind"] + " " + line["hold"] + "\\n")

    def children():  # this process's children, by name: a keeper names itself just after its fork
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                stat = open(f"/proc/{pid}/stat").read()
            except OSError:
                continue
            name, _, rest = stat.rpartition(") ")
            if int(rest.split()[1]) == os.getpid():
                found.append(name.partition("(")[2])
        return found

    def keepers(count):  # how many children, once `count` keepers among them have named themselves (5 s at most)
        until = time.monotonic() + 5
        while children().count("quinebox-keeper") < count and time.monotonic() < until:
            time.sleep(0.01)
        return len(children())
""")


def run(tmp_path: Path, body: str) -> tuple[subprocess.Popen, Path]:
    out = tmp_path / "swept"
    out.touch()
    proc = subprocess.Popen([sys.executable, "-c", PROLOGUE + textwrap.dedent(body), str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    return proc, out


def swept(out: Path) -> list[str]:
    return sorted(out.read_text().split("\n")[:-1])


def test_a_forked_child_tells_its_parents_keeper_and_its_death_removes_only_what_it_held(tmp_path):
    proc, out = run(tmp_path, """
        keeper.sweeps("test", swept)
        keeper.hold("test", "parent")
        child = os.fork()
        if child == 0:
            keeper.hold("test", "child-held")
            keeper.hold("test", "child-released")
            keeper.release("child-released")
            print(len(children()), flush=True)  # it forked no keeper of its own
            os.kill(os.getpid(), 9)
        os.waitpid(child, 0)
        print(keepers(1), flush=True)
        sys.stdin.read()
    """)
    assert proc.stdout.readline() == b"0\n"  # the child forked none of its own
    assert proc.stdout.readline() == b"1\n"
    wait_for(lambda: swept(out), timeout=5, what="the dead child's sweep")
    assert swept(out) == ["test child-held"]  # neither what it released nor its parent's
    proc.stdin.close()
    assert proc.wait(10) == 0
    wait_for(lambda: len(swept(out)) == 2, timeout=5, what="the sweep at the pipe's end")
    assert swept(out) == ["test child-held", "test parent"]


def test_sigkill_of_the_forker_removes_what_it_held_not_what_its_living_child_holds(tmp_path):
    proc, out = run(tmp_path, """
        keeper.sweeps("test", swept)
        keeper.hold("test", "parent")
        child = os.fork()
        if child == 0:
            keeper.hold("test", "child")
            print(os.getpid(), flush=True)
            time.sleep(300)
            os._exit(0)
        sys.stdin.read()
    """)
    child = int(proc.stdout.readline())
    try:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        wait_for(lambda: swept(out), timeout=5, what="the dead forker's sweep")
        assert swept(out) == ["test parent"]
    finally:
        os.kill(child, signal.SIGKILL)
    wait_for(lambda: len(swept(out)) == 2, timeout=5, what="the child's sweep")
    assert swept(out) == ["test child", "test parent"]


def test_a_kind_registered_after_the_keeper_was_forked_gets_a_keeper_that_removes_it(tmp_path):
    proc, out = run(tmp_path, """
        keeper.sweeps("early", swept)
        keeper.hold("early", "a")
        keeper.hold("early", "b")
        keeper.sweeps("late", swept)
        keeper.hold("late", "c")
        keeper.release("a")  # told to the keeper that holds it, the first
        print(keepers(2), flush=True)
        sys.stdin.read()
    """)
    assert proc.stdout.readline() == b"2\n"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    wait_for(lambda: len(swept(out)) >= 2, timeout=5, what="both keepers' sweeps")
    assert swept(out) == ["early b", "late c"]

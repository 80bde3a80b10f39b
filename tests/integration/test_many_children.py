"""One parent agent with more children alive at once than a box may hold connections to its host that carry none
(box/net/broker.py's MAX_CONNECTIONS): every child starts, runs alongside all the others, and hands its own output and
exit code back to the parent's fork.

Before, the host closed each of the box's connections past 64 on arrival, a spawn request unread: a parent forking 100
children got 61 of them started and the rest back as 125, "lost the host: [Errno 104] Connection reset by peer"
(bench/tree.py's 100 live agents, on runc and on bwrap alike), though `spawn:100` granted every one.
"""

from __future__ import annotations

import json

from commands import qb, scripts

from quinebox.agent.store import read_tape
from quinebox.box.net.broker import MAX_CONNECTIONS

#: Past the cap by more than the parent's own connections to the host (its init's lifeline, its agent's).
CHILDREN = MAX_CONNECTIONS + 8


def test_a_parent_forks_more_children_than_the_connection_cap_and_all_run_at_once(engine, tmp_path):
    """Each child marks itself started in a directory all of them hold, and waits (up to 20 s) until all CHILDREN have:
    the count it then prints proves they were alive at once (a host that served children only a slot at a time, the
    cap counting theirs, would leave each one short of it)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # writable to the boxes' user, whichever host uid it is
    barrier = (
        'me=$(cat <&3); : > "/shared/$me"; for _ in $(seq 100); do [ "$(ls /shared | wc -l)" -ge ' f"{CHILDREN}"
        ' ] && break; sleep 0.2; done; printf "%s: %s started\\n" "$me" "$(ls /shared | wc -l)" >&4'
    )
    children = [{"mission": f"child {i}", "material": f"child-{i}", "model": "script:child.yaml", "grants": ["rw:/shared"]} for i in range(CHILDREN)]
    scripts(
        tmp_path,
        child=[{"tool": "sh", "args": {"command": barrier, "timeout": 60}}, {"exit": "success"}],
        parent=[{"fork": {"mode": "wait", "children": children}}, {"exit": "success"}],
    )
    done = qb("run", "-q", "--json", "-m", f"script:{tmp_path / 'parent.yaml'}", "-g", f"spawn:{CHILDREN}", "-g", "depth:1",
              "-g", f"rw:{shared}=/shared", "fan out", timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    session = json.loads(done.stderr.splitlines()[-1])["session"]
    tape = read_tape(session)
    [fork] = [r for r in tape if r["kind"] == "tool" and r["name"] == "fork"]
    results = json.loads(fork["result"])["children"]
    assert [(r["exit_code"], r["stdout"], r["stderr"]) for r in results] == [(0, f"child-{i}: {CHILDREN} started\n", "") for i in range(CHILDREN)]
    assert len({r["session"] for r in results}) == CHILDREN
    assert len([r for r in tape if r["kind"] == "spawn"]) == CHILDREN


def test_a_child_the_parents_pids_limit_leaves_no_thread_for_is_one_line_not_a_crash(engine, tmp_path):
    """The parent's fork follows each child on a thread of its own; under the parent box's pids limit the threads run
    out before 45 children are followed. Each child it cannot follow is stopped and is one line and 125 in the fork's
    result; the parent goes on (before: `RuntimeError: can't start new thread`, the agent crashed, exit 1)."""
    scripts(tmp_path, child=[{"exit": "success"}], parent=[{"fork": {"mode": "wait", "children": [
        {"mission": f"c{i}", "model": "script:child.yaml"} for i in range(45)]}}, {"exit": "success"}])
    done = qb("run", "-q", "--json", "-m", f"script:{tmp_path / 'parent.yaml'}", "-g", "spawn:45", "-g", "depth:1", "-g", "pids:40", "go", timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    [fork] = [r for r in read_tape(json.loads(done.stderr.splitlines()[-1])["session"]) if r["kind"] == "tool" and r["name"] == "fork"]
    results = [(r["exit_code"], r["stdout"], r["stderr"]) for r in json.loads(fork["result"])["children"]]
    line = "quinebox: this box's pids limit leaves no thread to follow this child: fork fewer children at once, or grant it more pids\n"
    assert (0, "", "") in results and (125, "", line) in results and set(results) == {(0, "", ""), (125, "", line)}

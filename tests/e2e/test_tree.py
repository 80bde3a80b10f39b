"""Agents spawn agents: quinebox inside a box, attenuation on the host, and the supervised tree."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from live_boxes import live_boxes

from quinebox.agent.store import read_tape
from quinebox.box.policy import LABEL_PARENT, LABEL_SESSION

QUINEBOX = str(Path(sys.executable).with_name("quinebox"))
REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def qb(*args: str, input: bytes = b"", cwd=None, env=None, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([QUINEBOX, *args], input=input, capture_output=True, cwd=cwd, env=env, timeout=timeout)


def boxes(engine) -> list:
    return live_boxes(engine)


def wait_until(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    return predicate()


def scripts(tmp_path, **files) -> Path:
    for name, turns in files.items():
        (tmp_path / f"{name}.yaml").write_text(json.dumps({"turns": turns}))
    return tmp_path


@pytest.fixture
def granted(tmp_path):
    """A directory to grant: a read-only part and a writable part."""
    (tmp_path / "ro").mkdir()
    (tmp_path / "rw").mkdir()
    (tmp_path / "ro" / "f").write_text("x")
    os.symlink("/etc", tmp_path / "ro" / "to-etc")
    (tmp_path / "outside").mkdir()
    os.symlink(tmp_path / "outside", tmp_path / "ro" / "to-outside")
    tmp_path.chmod(0o755)
    (tmp_path / "rw").chmod(0o777)
    return tmp_path


@pytest.mark.parametrize(
    "child_grant, words",
    [
        ("rw:{d}/ro", "read-only here; rw may narrow to ro, never the reverse"),
        ("ro:/etc", "not within anything this box was granted"),
        ("ro:/world", "not within anything this box was granted"),
        ("ro:{d}/ro/to-etc", "never granted"),
        ("ro:{d}/ro/to-outside", "outside what this box was granted"),
        ("mem:2g", "more than this box's mem:1g"),
        ("pids:1000", "more than this box's pids:256"),
        ("cpus:64", "more than this box's cpus:1"),
        ("time:1h", "more than this box's time:"),
        ("net", "refused net: wider than this box's network grants (none)"),
        ("env:HOME", "holds no HOME"),
        ("syscall:ptrace", "may not make that call either"),
        ("spawn:3", "may start 3 more box(es), and the child counts as one"),
        ("depth:2", "at most 1 level(s) deep"),
    ],
)
def test_every_kind_of_escalation_is_refused_in_the_box(engine, granted, child_grant, words):
    grant = child_grant.format(d=granted)
    parent = ["-g", f"ro:{granted}/ro", "-g", f"rw:{granted}/rw", "-g", "spawn:3", "-g", "depth:2", "-g", "cpus:1", "--timeout", "60"]
    done = qb("exec", *parent, "--", "quinebox", "exec", "-g", grant, "--", "true")
    assert done.returncode == 125, done.stderr
    assert done.stderr.decode().startswith("quinebox: ") and words in done.stderr.decode()
    assert done.stderr.count(b"\n") == 1


def test_what_is_granted_passes_down_and_narrows(engine, granted):
    parent = ["-g", f"ro:{granted}/ro", "-g", f"rw:{granted}/rw", "-g", "spawn:2", "-g", "depth:1"]
    script = f"quinebox exec -g ro:{granted}/rw -- sh -c 'cat {granted}/ro/f 2>&1; echo y > {granted}/rw/g' ; echo $?"
    done = qb("exec", *parent, "--", "quinebox", "exec", "-g", f"ro:{granted}/ro", "-g", f"ro:{granted}/rw", "--", "sh", "-c", "cat " + str(granted / "ro" / "f"))
    assert (done.returncode, done.stdout) == (0, b"x")
    narrowed = qb("exec", *parent, "--", "sh", "-c", script)
    assert b"Read-only file system" in narrowed.stdout + narrowed.stderr
    assert not (granted / "rw" / "g").exists()


def test_spawn_and_depth_caps_hold(engine):
    three = qb("exec", "-g", "spawn:2", "-g", "depth:1", "--", "sh", "-c", "quinebox exec -- true; quinebox exec -- true; quinebox exec -- true; echo $?")
    assert three.stdout == b"125\n" and b"started all the boxes its spawn budget allowed" in three.stderr
    deep = qb("exec", "-g", "spawn:5", "-g", "depth:1", "--", "quinebox", "exec", "-g", "spawn:1", "--", "quinebox", "exec", "--", "true")
    assert deep.returncode == 125 and b"may not start boxes" in deep.stderr
    none = qb("exec", "--", "quinebox", "exec", "--", "true")
    assert none.returncode == 125 and b"may not start boxes" in none.stderr


def test_a_pipeline_of_two_children_inside_a_box_gives_exact_bytes(engine, tmp_path):
    scripts(
        tmp_path,
        parent=[{"sh": "printf 'b\\na\\nb\\n' | quinebox run -q -m script:sorter.yaml 'sort' | quinebox run -m script:counter.yaml 'count' >&4"}, {"exit": "success"}],
        sorter=[{"sh": "sort <&3 >&4"}, {"exit": "success"}],
        counter=[{"sh": "uniq -c <&3 >&4"}, {"exit": "success"}],
    )
    done = qb("run", "-q", "--json", "-m", f"script:{tmp_path / 'parent.yaml'}", "-g", "spawn:2", "-g", "depth:1", "pipe")
    assert (done.returncode, done.stdout) == (0, b"      1 a\n      2 b\n")
    session = json.loads(done.stderr.decode().splitlines()[-1])["session"]
    tree = qb("tree", session).stdout.decode()
    assert tree.count("exit 0 (exit_success)") == 3 and "depth 1  sort" in tree and "depth 1  count" in tree


def test_escalations_by_an_agent_are_recorded_on_its_tape(engine, tmp_path):
    scripts(tmp_path, greedy=[{"sh": "quinebox exec -g mem:8g -- true; echo $? >&4"}, {"exit": "success"}])
    done = qb("run", "-q", "--json", "-m", f"script:{tmp_path / 'greedy.yaml'}", "-g", "spawn:1", "-g", "depth:1", "greed")
    assert done.stdout == b"125\n"
    session = json.loads(done.stderr.decode().splitlines()[-1])["session"]
    [refusal] = [r for r in read_tape(session) if r["kind"] == "escalation_refused"]
    assert "mem:8g" in refusal["reason"] and refusal["request"]["grants"] == ["mem:8g"]


def test_race_kills_the_losers(engine, tmp_path):
    slow = {"mission": "slow", "model": "script:slow.yaml"}
    scripts(
        tmp_path,
        racer=[{"fork": {"mode": "race", "children": [slow, {"mission": "fast", "model": "script:fast.yaml"}, slow]}}, {"exit": "success"}],
        slow=[{"sh": "sleep 60"}, {"exit": "success"}],
        fast=[{"sh": "echo won >&4"}, {"exit": "success"}],
    )
    began = time.monotonic()
    done = qb("run", "-q", "--json", "-m", f"script:{tmp_path / 'racer.yaml'}", "-g", "spawn:3", "-g", "depth:1", "race")
    assert done.returncode == 0 and time.monotonic() - began < 30
    session = json.loads(done.stderr.decode().splitlines()[-1])["session"]
    [fork] = [r for r in read_tape(session) if r["kind"] == "tool" and r["name"] == "fork"]
    result = json.loads(fork["result"])
    assert result["winner"] == 1 and result["children"][1]["stdout"] == "won\n"
    assert [c["exit_code"] for c in result["children"]] == [137, 0, 137]
    assert boxes(engine) == []


def test_forgotten_children_are_still_bounded_by_the_tree(engine, tmp_path):
    scripts(
        tmp_path,
        forgetful=[{"fork": {"mode": "forget", "children": [{"mission": "linger", "model": "script:linger.yaml"}]}}, {"sh": "sleep 1"}, {"exit": "success"}],
        linger=[{"sh": "sleep 120"}, {"exit": "success"}],
    )
    began = time.monotonic()
    done = qb("run", "-q", "-m", f"script:{tmp_path / 'forgetful.yaml'}", "-g", "spawn:1", "-g", "depth:1", "forget")
    assert done.returncode == 0 and time.monotonic() - began < 30
    assert boxes(engine) == []


def tree_of_sleepers() -> list[str]:
    inner = "quinebox exec -- sleep 300 & quinebox exec -- sleep 300 & wait"
    middle = f"quinebox exec -g spawn:2 -g depth:1 -- sh -c '{inner}' & quinebox exec -- sleep 300 & wait"
    return [QUINEBOX, "exec", "-g", "spawn:10", "-g", "depth:2", "--", "sh", "-c", middle]


def test_killing_a_middle_box_kills_exactly_its_subtree(engine):
    root = subprocess.Popen(tree_of_sleepers(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert wait_until(lambda: len([b for b in boxes(engine) if b.status == "running"]) == 5), "the tree never reached five boxes"
        labels = {b.labels[LABEL_SESSION]: b.labels[LABEL_PARENT] for b in boxes(engine)}
        [top] = [s for s, p in labels.items() if p == ""]
        middle = [s for s, p in labels.items() if p == top and any(q == s for q in labels.values())][0]
        sibling = [s for s, p in labels.items() if p == top and s != middle][0]
        listing = qb("ps").stdout.decode()
        assert f"\n    {[s for s, p in labels.items() if p == middle][0]}" in listing  # grandchildren indented twice
        done = qb("kill", middle)
        assert done.returncode == 0 and done.stderr.decode().startswith("quinebox: killed 3 boxes")
        left = wait_until(lambda: (lambda now: now if len(now) == 2 else None)({b.labels[LABEL_SESSION] for b in boxes(engine)}), timeout=15)
        assert left == {top, sibling}
    finally:
        root.kill()
        root.wait()
    assert wait_until(lambda: boxes(engine) == [], timeout=10)


def test_sigkill_of_the_root_leaves_no_box_of_the_tree(engine):
    root = subprocess.Popen(tree_of_sleepers(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert wait_until(lambda: len([b for b in boxes(engine) if b.status == "running"]) == 5)
    root.send_signal(signal.SIGKILL)
    root.wait()
    assert wait_until(lambda: boxes(engine) == [], timeout=10)


def test_the_36_session_delegation_tree_example(engine):
    env = {**os.environ, "PATH": f"{Path(QUINEBOX).parent}:{os.environ['PATH']}"}
    env.pop("OPENAI_API_KEY", None)
    done = subprocess.run(["bash", str(EXAMPLES / "tree" / "run.sh")], capture_output=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.decode().splitlines() if "exit " in line]
    assert len(lines) == 36 and all("exit 0 (exit_success)" in line for line in lines)
    assert sum("depth 1" in line for line in lines) == 10 and sum("depth 2" in line for line in lines) == 25


def test_pipeline_examples(engine, tmp_path):
    env = {**os.environ, "PATH": f"{Path(QUINEBOX).parent}:{os.environ['PATH']}"}
    env.pop("OPENAI_API_KEY", None)
    log = subprocess.run(["bash", str(EXAMPLES / "pipelines" / "log.sh")], capture_output=True, env=env, timeout=120)
    assert log.stdout == b"      3 disk\n      1 net\n      1 auth\n"

    project = tmp_path / "proj"
    project.mkdir()
    git = lambda *a: subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *a], cwd=project, check=True, capture_output=True)
    (project / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (project / "test.sh").write_text('python3 -c "import calc; assert calc.add(2, 3) == 5, \'add is wrong\'; print(\'tests ok\')"\n')
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "base")
    (project / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (tmp_path / "fix.patch").write_bytes(subprocess.run(["git", "diff"], cwd=project, capture_output=True, check=True).stdout)
    chain = subprocess.run(["bash", str(EXAMPLES / "pipelines" / "diff-chain.sh")], cwd=project, capture_output=True, env=env, timeout=120)
    assert chain.stdout == b"# Change report\n\n- calc.py: review\n"
    git("checkout", "calc.py")
    for path in (project, project / "calc.py", project / "test.sh"):
        path.chmod(0o777 if path.is_dir() else 0o666)
    patched = subprocess.run(["bash", str(EXAMPLES / "pipelines" / "patch-then-test.sh"), str(project), str(tmp_path / "fix.patch")], capture_output=True, env=env, timeout=120)
    assert (patched.returncode, patched.stdout) == (0, b"applied\ntests ok\n"), patched.stderr
    assert "a + b" in (project / "calc.py").read_text()


def test_a_subtree_shares_one_token_budget(engine, tmp_path):
    scripts(
        tmp_path,
        spender=[{"fork": {"mode": "wait", "children": [{"mission": "spend", "model": "script:child.yaml", "grants": ["tokens:400"]}]}}, {"sh": "true"}, {"exit": "success"}],
        child=[{"sh": "true"}, {"sh": "true"}, {"sh": "true"}, {"exit": "success"}],
    )
    done = qb("run", "-q", "--json", "-m", f"script:{tmp_path / 'spender.yaml'}", "-g", "spawn:1", "-g", "depth:1", "-g", "tokens:1000", "share")
    summary = json.loads(done.stderr.decode().splitlines()[-1])
    tree = qb("tree", summary["session"]).stdout.decode()
    # The child stops at its own 400; the parent, having reserved them, runs out of its 1000 before it can exit.
    assert "depth 1  spend" in tree and tree.count("(token_budget)") == 2
    assert (done.returncode, summary["termination"]) == (1, "token_budget")


def test_a_child_never_outlives_its_parents_deadline(engine):
    began = time.monotonic()
    done = qb("exec", "--timeout", "3", "-g", "spawn:1", "-g", "depth:1", "--", "sh", "-c", "quinebox exec -- sleep 60; echo child=$?")
    assert done.returncode in (0, 124)
    assert time.monotonic() - began < 12
    assert done.stdout in (b"child=124\n", b"")  # the child's own deadline (the parent's time left) came first
    assert wait_until(lambda: boxes(engine) == [], timeout=10)


def test_the_tree_caps_model_calls_in_flight(engine, fake_openai):
    from openai_server import exit_, sh

    fake_openai.steps = [sh("true"), exit_()] * 10
    fake_openai.delay = 0.3
    env = {**os.environ, "QUINEBOX_MAX_CONCURRENT_CALLS": "1"}
    three = "for i in 1 2 3; do quinebox run 'one of three' & done; wait"
    done = qb("exec", "-g", "spawn:3", "-g", "depth:1", "--", "sh", "-c", three, env=env)
    assert done.returncode == 0, done.stderr
    assert len(fake_openai.requests) >= 3 and fake_openai.max_in_flight == 1


def test_a_malformed_request_costs_no_spawn_budget(engine):
    done = qb("exec", "-g", "spawn:1", "-g", "depth:1", "--", "sh", "-c", "quinebox exec -w relative -- true; echo $?; quinebox exec -- echo started")
    assert done.stdout == b"125\nstarted\n" and b"bad workdir 'relative'" in done.stderr


def test_a_child_its_runtime_refuses_ends_its_parents_tree_at_once(engine):
    """A child box attached to its tree, then refused by its runtime (its workdir a file), once left the root's end
    waiting forever for a box that never ran: now the child's 125 comes back and the tree ends with it."""
    started = time.monotonic()
    done = qb("exec", "-g", "spawn:1", "-g", "depth:1", "--", "/.quinebox/bin/quinebox", "exec", "--workdir", "/etc/passwd", "--", "true", timeout=60)
    assert done.returncode == 125, done.stderr
    assert b"not a directory" in done.stderr and done.stdout == b""
    assert time.monotonic() - started < 30

"""`quinebox resume`: a real `quinebox run` killed with SIGKILL mid-mission, at a known point (its scripted model's
sh step waits on a file of the test's), then resumed; on each backend.

What is checked: the exact bytes of the deliverable and the exit status, the world, that the complete turns did not
run again and the turn in flight ran exactly once more (counters in a host directory the box holds rw), the
material read on from where it was, the budgets as spent, `ls` before and after, the audit log, and the refusals.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from commands import QUINEBOX, qb, scripts, wait_for

from quinebox.agent.store import Index, read_tape
from quinebox.state import session_dir

MATERIAL = b"l1\nl2\nl3\n"
#: The turn in flight when the test kills the run: the first time, it leaves a file in the world that going back to
#: the turn's revision must take away; it counts itself, waits while /gate/hold is there, then reads one line.
IN_FLIGHT = (
    "[ -e /gate/inflight ] || echo lost > /world/lost-turn-only; echo ran >> /gate/inflight; while [ -e /gate/hold ]; do sleep 0.1; done; "
    "IFS= read -r line <&3; printf 'second: %s\\n' \"$line\" >&4; echo \"$line\" > /world/second"
)
#: Each turn counts itself in /gate: before, inflight, after.
TURNS = [
    {"sh": "IFS= read -r line <&3; printf 'first: %s\\n' \"$line\" >&4; echo \"$line\" > /world/first; echo ran >> /gate/before"},
    {"sh": IN_FLIGHT},
    {"sh": "cat <&3 >&4; echo ran >> /gate/after"},
    {"exit": "success"},
]
#: The same with an exec before the turn in flight: a new conversation, in the same process, reading on in its material.
EXECED = [TURNS[0], {"exec": "the first line is read; go on"}, *TURNS[1:]]
BACKENDS = [
    pytest.param({"QUINEBOX_BACKEND": "oci", "QUINEBOX_RUNTIME": "runc"}, id="runc"),
    # gVisor's boxes and the engine's are root's alone here (CI's rootless pass leaves them out)
    pytest.param({"QUINEBOX_BACKEND": "oci", "QUINEBOX_RUNTIME": "runsc"}, id="runsc", marks=pytest.mark.root_only),
    pytest.param({"QUINEBOX_BACKEND": "docker"}, id="docker", marks=pytest.mark.root_only),
]


@pytest.fixture
def gate(tmp_path):
    """A host directory the box holds at /gate: the counters the turns leave, and `hold`, which keeps the turn in flight waiting."""
    path = tmp_path / "gate"
    path.mkdir()
    path.chmod(0o777)
    (path / "hold").write_text("")
    return path


def lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def session_of(mission: str) -> str:
    index = Index()
    try:
        return next(row.id for row in index.recent(200) if row.mission == mission)
    finally:
        index.close()


def owner_pid(session: str) -> int:
    index = Index()
    try:
        return int(index.owners([session])[session].split(":")[1])
    finally:
        index.close()


def run_until_in_flight(tmp_path, gate: Path, mission: str, *args: str, env: dict | None = None, turns: list | None = None) -> tuple[str, subprocess.Popen]:
    """`quinebox run` of the scripted mission, waiting in its turn in flight: (its session, the process)."""
    model = scripts(tmp_path, model=turns or TURNS) / "model.yaml"
    material = tmp_path / "material"
    material.write_bytes(MATERIAL)
    with open(material, "rb") as stdin:
        proc = subprocess.Popen(
            [QUINEBOX, "run", "-m", f"script:{model}", "-g", f"rw:{gate}=/gate", *args, mission],
            stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **(env or {})},
        )
    wait_for(lambda: lines(gate / "inflight") == 1 or proc.poll() is not None, timeout=180, what="the run reaching its turn in flight")
    assert proc.poll() is None, proc.communicate()
    return session_of(mission), proc


def kill_host(session: str, proc: subprocess.Popen) -> bytes:
    """SIGKILL the process running the session (the run's own, or a command server's worker); what it had delivered."""
    os.kill(owner_pid(session), signal.SIGKILL)
    out, _ = proc.communicate(timeout=60)
    return out


def listed(session: str) -> str:
    row = next(line for line in qb("ls", "-n", "200").stdout.decode().splitlines() if line.startswith(session))
    return row.split()[3]  # ID, the date and time it started, EXIT


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_killed_run_goes_on_from_its_last_complete_turn(tmp_path, gate, backend):
    mission = f"resume on {next(iter(backend.values()))} {os.urandom(3).hex()}"
    session, proc = run_until_in_flight(tmp_path, gate, mission, env=backend, turns=EXECED)
    still = qb("resume", session, env={**os.environ, **backend})
    assert still.returncode == 125 and b"is still running" in still.stderr and still.stderr.count(b"\n") == 1
    assert kill_host(session, proc) == b"first: l1\n"
    assert listed(session) == "interrupted" and f"{session}  interrupted" in qb("tree", session).stdout.decode()
    assert f"outcome   (interrupted: its process was lost; `quinebox resume {session}` goes on with it)" in qb("show", session).stdout.decode()

    (gate / "hold").unlink()
    done = subprocess.run([QUINEBOX, "resume", session], input=MATERIAL, capture_output=True, timeout=180, env={**os.environ, **backend})
    assert (done.returncode, done.stdout) == (0, b"second: l2\nl3\n"), done.stderr
    assert (lines(gate / "before"), lines(gate / "inflight"), lines(gate / "after")) == (1, 2, 1)  # the turn in flight once more
    world = session_dir(session) / "world" / "tree"
    assert {p.name: p.read_text() for p in world.iterdir()} == {"first": "l1\n", "second": "l2\n"}  # lost-turn-only went
    assert listed(session) == "0"
    shown = qb("show", session).stdout.decode()
    assert "resumed   at turn 3 (its recorded answer taken again), world revision 1, 3 bytes of material passed over" in shown
    assert "outcome   exit 0 (exit_success), 5 turns" in shown

    tape = read_tape(session)
    resumed = [r for r in tape if r["kind"] == "resumed"]
    assert len(resumed) == 1 and (resumed[0]["turn"], resumed[0]["cycle"], resumed[0]["answered"], resumed[0]["material"]) == (3, 1, True, 3)
    assert [(r["turn"], r["cycle"]) for r in tape if r["kind"] == "request"] == [(1, 0), (2, 0), (3, 1), (4, 1), (5, 1)]  # none asked twice
    assert [r["material"] for r in tape if r["kind"] == "request"] == [0, 3, 3, 6, 9]  # read on across the exec and the resume
    assert tape[-1]["kind"] == "outcome" and tape[-1]["exit_code"] == 0 and tape[-1]["turns"] == 5
    audit = [json.loads(line) for line in qb("audit", "--session", session, "--json").stdout.splitlines()]
    assert [r["facts"]["turn"] for r in audit if r["kind"] == "session_resumed"] == [3]
    assert qb("audit", "verify").returncode == 0


def test_spent_children_stay_spent_and_their_results_stay_in_the_conversation(tmp_path, gate):
    """spawn:1 went on turn 1's child: after the resume, turn 3 asks for another and is refused, as it would have been."""
    scripts(tmp_path, child=[{"sh": "echo ran >> /gate/children"}, {"exit": "success"}])
    fork = {"fork": {"mode": "wait", "children": [{"mission": "help", "model": "script:child.yaml", "grants": ["rw:/gate"]}]}}
    turns = [fork, {"sh": "echo ran >> /gate/inflight; while [ -e /gate/hold ]; do sleep 0.1; done"}, fork, {"exit": "success"}]
    mission = f"resume with children {os.urandom(3).hex()}"
    session, proc = run_until_in_flight(tmp_path, gate, mission, "-g", "spawn:1", "-g", "depth:1", turns=turns)
    kill_host(session, proc)
    (gate / "hold").unlink()
    done = qb("resume", "-q", session, input=MATERIAL)
    assert done.returncode == 0, done.stderr
    assert (lines(gate / "children"), lines(gate / "inflight")) == (1, 2)
    tape = read_tape(session)
    refused = [r for r in tape if r["kind"] == "escalation_refused"]
    assert len(refused) == 1 and "spawn budget" in refused[0]["reason"]
    first_fork = next(r for r in tape if r["kind"] == "tool" and r["name"] == "fork")
    assert json.loads(first_fork["result"])["children"][0]["exit_code"] == 0
    assert [r["kind"] for r in tape].count("spawn") == 1


def test_the_token_budget_goes_on_as_spent_and_the_python_api_gives_the_agents_exit(tmp_path, gate):
    """The budget holds turns 1 and 2 of a reference run and one token more: turn 3 may still ask, turn 4 may not. A
    resume that started its budget afresh would have finished the mission."""
    import quinebox

    mission = f"resume in budget {os.urandom(3).hex()}"  # the same for both: the system prompt holds it
    reference = tmp_path / "reference"
    reference.mkdir()
    (gate / "hold").unlink()
    model = scripts(reference, model=TURNS) / "model.yaml"
    first = qb("run", "-q", "--json", "-m", f"script:{model}", "-g", f"rw:{gate}=/gate", mission, input=MATERIAL)
    assert first.returncode == 0, first.stderr
    usage = [r["usage"]["total_tokens"] for r in read_tape(json.loads(first.stderr.splitlines()[-1])["session"]) if r["kind"] == "response"]
    assert usage[2] < usage[0] + usage[1]  # so a budget started afresh at the resume would have let turn 4 ask
    for name in ("before", "inflight", "after"):
        (gate / name).unlink()
    (gate / "hold").write_text("")

    session, proc = run_until_in_flight(tmp_path, gate, mission, "--max-tokens", str(usage[0] + usage[1] + 1))
    kill_host(session, proc)
    (gate / "hold").unlink()
    result = quinebox.resume_session(session, input=MATERIAL)
    assert (result.returncode, result.termination) == (1, "token_budget"), result.stderr
    assert result.stdout == b"second: l2\nl3\n" and result.turns == 3 and result.tokens > usage[0] + usage[1]
    assert (lines(gate / "inflight"), lines(gate / "after")) == (2, 1)


def test_one_resume_at_a_time_and_never_of_what_ended_or_was_pruned(tmp_path, gate):
    mission = f"resume twice {os.urandom(3).hex()}"
    session, proc = run_until_in_flight(tmp_path, gate, mission)
    kill_host(session, proc)
    (gate / "inflight").unlink()
    with open(tmp_path / "material", "rb") as material:
        first = subprocess.Popen([QUINEBOX, "resume", "-q", session], stdin=material, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for(lambda: lines(gate / "inflight") == 1, timeout=180, what="the resumed turn in flight")
    second = qb("resume", session, input=MATERIAL)
    assert second.returncode == 125 and b"is being resumed already" in second.stderr and second.stderr.count(b"\n") == 1
    assert listed(session) == "running"
    (gate / "hold").unlink()
    out, err = first.communicate(timeout=180)
    assert (first.returncode, out) == (0, b"second: l2\nl3\n"), err
    assert [r["kind"] for r in read_tape(session)].count("resumed") == 1

    ended = qb("resume", session, input=MATERIAL)
    assert ended.returncode == 125 and b"has ended (exit 0, exit_success)" in ended.stderr and ended.stderr.count(b"\n") == 1
    assert qb("prune", "--keep", "0", "--succeeded").returncode == 0
    pruned = qb("resume", session[:8])
    assert pruned.returncode == 125 and b"was pruned at" in pruned.stderr and pruned.stderr.count(b"\n") == 1


def test_the_material_given_must_hold_what_the_session_had_read(tmp_path, gate):
    session, proc = run_until_in_flight(tmp_path, gate, f"resume short {os.urandom(3).hex()}")
    kill_host(session, proc)
    short = qb("resume", session, input=b"l1")
    assert short.returncode == 125 and b"holds 2 bytes, and session" in short.stderr and b"had read 3" in short.stderr
    assert [r["kind"] for r in read_tape(session)].count("resumed") == 0  # nothing started
    assert listed(session) == "interrupted"


def test_lost_while_the_model_was_asked_the_model_is_asked_again_the_same(tmp_path, gate, fake_openai):
    """The real openai client against our server: the second call is held until the run is killed; the resumed session
    asks it again with the very conversation the lost one had sent, and goes on."""
    from openai_server import exit_, sh

    turn_two = sh("IFS= read -r line <&3; printf 'second: %s\\n' \"$line\" >&4; echo ran >> /gate/inflight")
    fake_openai.steps = [sh("IFS= read -r line <&3; echo ran >> /gate/before"), {**turn_two, "delay": 600}, turn_two, exit_()]
    mission = f"resume mid-call {os.urandom(3).hex()}"
    material = tmp_path / "material"
    material.write_bytes(MATERIAL)
    with open(material, "rb") as stdin:
        proc = subprocess.Popen([QUINEBOX, "run", "-g", f"rw:{gate}=/gate", mission], stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for(lambda: len(fake_openai.requests) == 2, timeout=180, what="the second model call")
    session = session_of(mission)
    kill_host(session, proc)
    done = qb("resume", "-q", session, input=MATERIAL)
    assert (done.returncode, done.stdout) == (0, b"second: l2\n"), done.stderr
    assert len(fake_openai.requests) == 4 and fake_openai.requests[2].body["messages"] == fake_openai.requests[1].body["messages"]
    assert (lines(gate / "before"), lines(gate / "inflight")) == (1, 1)
    tape = read_tape(session)
    assert [r["answered"] for r in tape if r["kind"] == "resumed"] == [False]
    assert [r["turn"] for r in tape if r["kind"] == "request"] == [1, 2, 2, 3]
    assert [r["turn"] for r in tape if r["kind"] == "response"] == [1, 2, 3]

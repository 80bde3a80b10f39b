"""mini-swe-agent with quinebox as its environment, driven by its own machinery: its DeterministicModel through a real
DefaultAgent, its `get_environment` and `mini` CLI loading `environment_class` from YAML, and its Docker
environment as the reference for what a timeout returns. No network, no model key.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from quinebox import QuineboxError, Sandbox

CLASS = "quinebox.integrations.minisweagent.QuineboxEnvironment"
SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
PROGRAM = "def answer():\n    return 6 * 7\n\nprint(answer())\n"


@pytest.fixture(scope="module")
def mswea(tmp_path_factory):
    """mini-swe-agent imported with its global config dir a temporary one (it makes it on import) and quiet."""
    os.environ["MSWEA_GLOBAL_CONFIG_DIR"] = str(tmp_path_factory.mktemp("mswea-config"))
    os.environ["MSWEA_SILENT_STARTUP"] = "1"
    os.environ["MSWEA_CONFIGURED"] = "1"
    import minisweagent

    return minisweagent


@pytest.fixture
def environment(mswea):
    from quinebox.integrations.minisweagent import QuineboxEnvironment

    env = QuineboxEnvironment()
    yield env
    env.cleanup()


def step(command: str) -> dict:
    from minisweagent.models.test_models import make_output

    return make_output(f"I run {command!r}.", [{"command": command}])


def test_default_agent_runs_a_trajectory_in_the_box_and_submits(environment, tmp_path):
    """Its DeterministicModel on a real DefaultAgent: make a file, run it, see the output, submit the file."""
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.models.test_models import DeterministicModel

    model = DeterministicModel(outputs=[
        step(f"cat > answer.py <<'EOF'\n{PROGRAM}EOF"),
        step("python3 answer.py"),
        step("echo one; echo two >&2; echo three; exit 3"),
        step(f"echo {SUBMIT} && cat answer.py"),
    ])
    traj = tmp_path / "run.traj.json"
    agent = DefaultAgent(
        model, environment, system_template="You run in {{system}} {{release}} {{machine}}.",
        instance_template="{{task}}", step_limit=10, cost_limit=0, output_path=traj,  # its model bills 1.0 a call
    )

    result = agent.run("Write a program that prints the answer.")

    assert result == {"exit_status": "Submitted", "submission": PROGRAM}
    sb = environment.sandbox
    assert sb.read_file(f"{sb.workdir}/answer.py") == PROGRAM.encode()
    observations = [m["content"] for m in agent.messages if m["role"] == "user"][1:]
    assert observations == [
        "<returncode>0</returncode>\n<output>\n</output>",
        "<returncode>0</returncode>\n<output>\n42\n</output>",
        "<returncode>3</returncode>\n<output>\none\ntwo\nthree\n</output>",  # stderr in its place, as docker's 2>&1
    ]
    assert agent.messages[0]["content"].startswith("You run in Linux ")
    saved = json.loads(traj.read_text())
    assert saved["info"]["exit_status"] == "Submitted" and saved["info"]["submission"] == PROGRAM
    assert saved["info"]["config"]["environment_type"] == CLASS
    assert saved["info"]["quinebox_box"] == sb.id


def test_environment_class_in_yaml_loads_through_get_environment(mswea, tmp_path):
    """`environment_class: quinebox.integrations.minisweagent.QuineboxEnvironment` as its config files say it."""
    from minisweagent.config import get_config_from_spec
    from minisweagent.environments import get_environment

    config_file = tmp_path / "quinebox.yaml"
    config_file.write_text(
        "environment:\n"
        f"  environment_class: {CLASS}\n"
        "  cwd: /tmp\n  timeout: 7\n  grants: ['mem:256m']\n"
        "  env:\n    GREETING: hello\n  forward_env: [MSWEA_TEST_FORWARDED, MSWEA_TEST_UNSET]\n"
    )
    os.environ["MSWEA_TEST_FORWARDED"] = "from the host"
    env = get_environment(get_config_from_spec(str(config_file))["environment"], default_type="local")
    try:
        assert type(env).__module__ + "." + type(env).__name__ == CLASS
        assert env.config.timeout == 7 and env.config.grants == ["mem:256m"]
        out = env.execute({"command": 'echo "$GREETING/$MSWEA_TEST_FORWARDED/${MSWEA_TEST_UNSET-unset}"; pwd'})
        assert out == {"output": "hello/from the host/unset\n/tmp\n", "returncode": 0, "exception_info": ""}
        assert env.execute({"command": "pwd"}, cwd="/")["output"] == "/\n"
        assert env.get_template_vars()["cwd"] == "/tmp" and env.get_template_vars()["system"] == "Linux"
    finally:
        env.cleanup()
        del os.environ["MSWEA_TEST_FORWARDED"]
    assert env.sandbox.returncode is not None, "cleanup() removes the box"
    gone = env.execute({"command": "true"})  # as docker's: an action that could not run is a result, not a raise
    assert (gone["returncode"], gone["output"], gone["extra"]["exception_type"]) == (-1, "", "QuineboxError")
    assert gone["exception_info"].startswith("An error occurred while executing the command: box ") and "closed" in gone["exception_info"]


def test_the_mini_cli_runs_with_quinebox_from_its_yaml(mswea, tmp_path):
    """`mini -c mini.yaml -c ours.yaml`: its own run code reads environment_class and the scripted model's outputs."""
    outputs = [step("printf 'hi from the box\\n' > note.txt"), step(f"echo {SUBMIT} && cat note.txt")]
    ours = {"model": {"model_class": "deterministic", "model_name": "deterministic", "outputs": outputs},
            "environment": {"environment_class": CLASS, "timeout": 20}, "agent": {"cost_limit": 0}}
    config_file = tmp_path / "ours.yaml"
    config_file.write_text(json.dumps(ours))  # JSON is YAML
    traj = tmp_path / "mini.traj.json"
    mini = Path(sys.executable).with_name("mini")
    run = subprocess.run(
        [str(mini), "-c", "mini.yaml", "-c", str(config_file), "-y", "--exit-immediately", "-t", "Leave a note.", "-o", str(traj)],
        stdin=subprocess.DEVNULL, capture_output=True, timeout=60,  # a box closed in __del__ at exit hung here for ever
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    saved = json.loads(traj.read_text())
    assert saved["info"]["exit_status"] == "Submitted", saved["messages"][-1]
    assert saved["info"]["submission"] == "hi from the box\n"
    assert saved["info"]["config"]["environment_type"] == CLASS
    listed = subprocess.run([str(Path(sys.executable).with_name("quinebox")), "box", "ls"], capture_output=True, timeout=60)
    assert listed.returncode == 0 and saved["info"]["quinebox_box"].encode() not in listed.stdout, "the box ends with mini"


def test_a_timeout_returns_what_dockers_does_and_kills_the_action(mswea, engine):
    """The same action, timed out, in its DockerEnvironment and in ours: the same result but the command's text,
    and here the action's process tree is gone (docker exec leaves its sleep running) and the box stays."""
    from minisweagent.environments.docker import DockerEnvironment

    from quinebox.box.spec import DEFAULT_IMAGE
    from quinebox.integrations.minisweagent import QuineboxEnvironment

    action = {"command": "echo started; sleep 30"}
    docker_env = DockerEnvironment(image=DEFAULT_IMAGE, timeout=1)
    try:
        theirs = docker_env.execute(action)
    finally:
        docker_env.cleanup()
    env = QuineboxEnvironment(timeout=30)
    try:
        began = time.monotonic()
        ours = env.execute(action, timeout=1)
        took = time.monotonic() - began
        left = env.execute({"command": "cat /proc/[0-9]*/comm"})
    finally:
        env.cleanup()
    assert ours == {
        "output": "started\n",
        "returncode": -1,
        "exception_info": "An error occurred while executing the command: Command 'echo started; sleep 30' timed out after 1 seconds",
        "extra": {"exception_type": "TimeoutExpired", "exception": "Command 'echo started; sleep 30' timed out after 1 seconds"},
    }
    assert set(theirs) == set(ours) and set(theirs["extra"]) == set(ours["extra"])
    assert (theirs["output"], theirs["returncode"], theirs["extra"]["exception_type"]) == ("started\n", -1, "TimeoutExpired")
    assert theirs["exception_info"].endswith("timed out after 1 seconds")
    assert took < 10, took
    assert left["returncode"] == 0 and "sleep" not in left["output"].split(), left


def test_submission_only_on_a_clean_first_line(environment, mswea):
    """The sentinel must open the output and the action succeed, as docker's _check_finished asks."""
    from minisweagent.exceptions import Submitted

    assert environment.execute({"command": f"echo {SUBMIT}; exit 1"})["returncode"] == 1
    assert environment.execute({"command": f"echo before; echo {SUBMIT}"})["returncode"] == 0
    with pytest.raises(Submitted) as submitted:
        environment.execute({"command": f"echo; echo '  {SUBMIT}'; printf 'a\\nb'"})
    assert submitted.value.messages == ({"role": "exit", "content": "a\nb", "extra": {"exit_status": "Submitted", "submission": "a\nb"}},)


def test_output_past_max_output_is_cut_and_never_submitted(mswea):
    from quinebox.integrations.minisweagent import QuineboxEnvironment

    env = QuineboxEnvironment(max_output=4096)
    try:
        out = env.execute({"command": f"echo {SUBMIT}; head -c 100000 /dev/zero | tr '\\0' a"})
    finally:
        env.cleanup()
    assert out["returncode"] == 0 and out["extra"] == {"truncated": True}
    assert out["output"].startswith(f"{SUBMIT}\naaaa") and len(out["output"].encode()) <= 4096
    assert "cut at 4096 bytes" in out["exception_info"]


def test_a_refused_config_says_so_and_leaves_nothing(mswea):
    from quinebox.integrations.minisweagent import QuineboxEnvironment

    with pytest.raises(QuineboxError):
        QuineboxEnvironment(grants=["bogus:grant"])


def test_exec_latency_through_the_environment_against_sb_exec(environment, engine):
    """The figures docs/frameworks/mini-swe-agent.md gives: what a step costs beyond the box's own exec, and what
    one costs in mini-swe-agent's DockerEnvironment on the same engine and image. The paths take turns, so a
    machine's load weighs on each alike."""
    from minisweagent.environments.docker import DockerEnvironment

    from quinebox.box.spec import DEFAULT_IMAGE

    sb: Sandbox = environment.sandbox
    docker_env = DockerEnvironment(image=DEFAULT_IMAGE)
    paths = {
        "env.execute": lambda: environment.execute({"command": "true"}),
        "sb.exec(bash -lc true)": lambda: sb.exec(["bash", "-lc", "true"]),
        "sb.exec(true)": lambda: sb.exec(["true"]),
        "its DockerEnvironment": lambda: docker_env.execute({"command": "true"}),
    }
    times: dict[str, list[float]] = {name: [] for name in paths}
    runs = 30
    try:
        for _ in range(runs + 1):
            for name, call in paths.items():
                began = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - began)
    finally:
        docker_env.cleanup()
    ms = {name: statistics.median(t[1:]) * 1000 for name, t in times.items()}  # the first of each warms up
    print(f"\nmini-swe-agent step latency (median of {runs}): " + ", ".join(f"{name} {v:.1f} ms" for name, v in ms.items()))
    assert ms["env.execute"] < ms["sb.exec(bash -lc true)"] * 2 + 20

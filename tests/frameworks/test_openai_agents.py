"""The OpenAI Agents SDK's own SandboxAgent, its sandbox a quinebox box: real `Runner.run`s driven by a scripted model
(the SDK's `Model` interface answering with the tool calls its sandbox tools take), no network and no key. What a
user depends on: the agent's file is written, run and read in the box, byte for byte; the workspace persisted at the
run's end is a tar of exactly those files; a later run resumed from the run's state finds them (the box gone, a new
one hydrated); `resume` reattaches to a box that still lives (the same box: what lay outside the workspace is still
there) and restores once it is gone; on gVisor a persisted session is also a checkpoint of the live box."""

from __future__ import annotations

import asyncio
import io
import json
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest
from agents import RunConfig, Runner
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.sandbox import LocalSnapshotSpec, Manifest, SandboxAgent, SandboxRunConfig, User
from agents.sandbox.errors import ExecTimeoutError, WorkspaceReadNotFoundError
from agents.usage import Usage
from openai.types.responses import ResponseCustomToolCall, ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from quinebox import QuineboxError, Sandbox
from quinebox.integrations.openai_agents import QuineboxSandboxClient, QuineboxSandboxClientOptions

#: What the agent writes with apply_patch (whose added file ends at its last line, with no newline after it).
PROGRAM = b'import sys\nsys.stdout.write("hello from " + "quinebox\\n")'
OUTPUT = b"hello from quinebox\n"


class ScriptedModel(Model):
    """The SDK's Model interface: each call answered with the next scripted output, what it was shown kept."""

    def __init__(self, *turns: list[Any]):
        self.turns = list(turns)
        self.shown: list[Any] = []

    async def get_response(self, system_instructions, input, model_settings, tools, output_schema, handoffs, tracing, **kwargs) -> ModelResponse:
        self.shown.append(input)
        turn = self.turns.pop(0)
        return ModelResponse(output=turn(input) if callable(turn) else turn, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any):  # pragma: no cover - Runner.run does not stream
        raise NotImplementedError

    def tool_outputs(self) -> list[str]:
        """The outputs of the tools the agent ran, as the model was shown them."""
        last = self.shown[-1]
        return [item["output"] for item in last if isinstance(item, dict) and item.get("type", "").endswith("call_output")]


def shell(call_id: str, cmd: str, **options: Any) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(type="function_call", call_id=call_id, name="exec_command", arguments=json.dumps({"cmd": cmd, **options}))


def poll(call_id: str, chars: str) -> Any:
    """A write_stdin call to the session the command just run was given (read from its output when the call is made)."""
    def turn(shown: list[Any]) -> list[Any]:
        said = [item["output"] for item in shown if isinstance(item, dict) and item.get("type", "").endswith("call_output")][-1]
        session = int(said.split("Process running with session ID ")[1].split("\n")[0])
        return [ResponseFunctionToolCall(type="function_call", call_id=call_id, name="write_stdin", arguments=json.dumps({"session_id": session, "chars": chars}))]

    return turn


def patch(call_id: str, text: str) -> ResponseCustomToolCall:
    return ResponseCustomToolCall(type="custom_tool_call", call_id=call_id, name="apply_patch", input=text)


def say(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(id="msg", type="message", role="assistant", status="completed",
                                 content=[ResponseOutputText(type="output_text", text=text, annotations=[])])


def output_of(tool_output: str) -> bytes:
    """What a command printed, from exec_command's answer (its header, then "Output:" and the bytes)."""
    return tool_output.partition("\nOutput:\n")[2].encode()


def gone(box_id: str) -> bool:
    try:
        Sandbox.connect(box_id).close()
    except QuineboxError:
        return True
    return False


def test_a_sandbox_agent_writes_runs_and_reads_in_the_box_persists_and_a_later_run_resumes(tmp_path):
    created = "*** Begin Patch\n*** Add File: hello.py\n" + "".join(f"+{line}\n" for line in PROGRAM.decode().splitlines()) + "*** End Patch\n"
    model = ScriptedModel(
        [patch("c1", created)],
        [shell("c2", "python3 hello.py > out.txt")],
        [shell("c3", "cat out.txt")],
        [say("done")],
    )
    agent = SandboxAgent(name="coder", model=model, instructions="Write hello.py, run it, read what it printed.")
    snapshots = LocalSnapshotSpec(base_path=tmp_path / "snapshots")
    config = RunConfig(tracing_disabled=True, sandbox=SandboxRunConfig(client=QuineboxSandboxClient(), options=QuineboxSandboxClientOptions(), snapshot=snapshots))

    result = asyncio.run(asyncio.wait_for(Runner.run(agent, "go", run_config=config), 120))

    assert result.final_output == "done"
    outputs = model.tool_outputs()
    assert "Process exited with code 0" in outputs[1]
    assert output_of(outputs[2]) == OUTPUT
    state = result.to_state().to_json()["sandbox"]["session_state"]
    assert state["type"] == "quinebox" and state["manifest"]["root"] == "/world"
    assert gone(state["box_id"])  # the run's end deleted its box
    with tarfile.open(tmp_path / "snapshots" / f"{state['session_id']}.tar") as persisted:
        names = {member.name: member for member in persisted.getmembers()}
        assert persisted.extractfile(names["./hello.py"]).read() == PROGRAM
        assert persisted.extractfile(names["./out.txt"]).read() == OUTPUT

    # A later run, resumed from the first's state: its box is gone, so a new one is hydrated from what was persisted.
    later = ScriptedModel([shell("c4", "cat out.txt hello.py")], [say("seen")])
    client = QuineboxSandboxClient()
    resumed = RunConfig(tracing_disabled=True, sandbox=SandboxRunConfig(client=client, session_state=client.deserialize_session_state(state)))
    again = asyncio.run(asyncio.wait_for(Runner.run(SandboxAgent(name="coder", model=later), "look", run_config=resumed), 120))
    assert again.final_output == "seen"
    assert output_of(later.tool_outputs()[0]) == OUTPUT + PROGRAM


def test_a_command_that_outlasts_its_yield_goes_on_and_the_agent_writes_to_it(tmp_path):
    model = ScriptedModel(
        [shell("c1", "sleep 1; echo late", yield_time_ms=250)],
        poll("c2", ""),
        [shell("c3", "read line; echo got $line", tty=True, yield_time_ms=250)],
        poll("c4", "quinebox\n"),
        [shell("c5", "sleep 60", tty=True, yield_time_ms=250)],
        poll("c6", "\u0003"),
        [say("done")],
    )
    sandbox = SandboxRunConfig(client=QuineboxSandboxClient(), options=QuineboxSandboxClientOptions(), snapshot=LocalSnapshotSpec(base_path=tmp_path))
    config = RunConfig(tracing_disabled=True, sandbox=sandbox)
    result = asyncio.run(asyncio.wait_for(Runner.run(SandboxAgent(name="waiter", model=model), "go", run_config=config), 120))
    assert result.final_output == "done"
    outputs = model.tool_outputs()
    assert "Process running with session ID" in outputs[0] and output_of(outputs[0]) == b""
    assert "Process exited with code 0" in outputs[1] and output_of(outputs[1]) == b"late\n"
    assert output_of(outputs[3]) == b"got quinebox\n"
    assert "Process exited with code 137" in outputs[5]  # Ctrl-C ended the command's tree


async def _resume_reattaches_then_restores(tmp_path: Path) -> None:
    data = bytes(range(256)) * 3
    client = QuineboxSandboxClient()
    session = await client.create(options=QuineboxSandboxClientOptions(), snapshot=LocalSnapshotSpec(base_path=tmp_path))
    await session.start()
    await session.write(Path("notes/a.bin"), io.BytesIO(data))
    await session.exec("echo outside-the-workspace > /tmp/marker")
    await session.stop()  # persisted
    payload = json.loads(json.dumps(client.serialize_session_state(session.state)))
    box_id = payload["box_id"]
    await session.shutdown()  # detached: the box lives on
    assert not gone(box_id)

    # Reattached: the same box, so what lay outside the workspace is there too.
    other = QuineboxSandboxClient()
    attached = await other.resume(other.deserialize_session_state(dict(payload)))
    await attached.start()
    assert attached.state.box_id == box_id
    assert (await attached.read(Path("notes/a.bin"))).read() == data
    assert (await attached.exec("cat /tmp/marker")).stdout == b"outside-the-workspace\n"

    # The SDK's exec through the provider against the box's own exec, each the median of 20 `true`s.
    direct = Sandbox.connect(box_id)
    try:
        through, own = [], []
        for _ in range(20):
            began = time.perf_counter()
            assert (await attached.exec("true", shell=False)).exit_code == 0
            through.append(time.perf_counter() - began)
            began = time.perf_counter()
            assert direct.exec(["true"], timeout=10).returncode == 0
            own.append(time.perf_counter() - began)
    finally:
        direct.close()
    with Sandbox() as owned:  # for scale: a box this process owns, whose execs need no holder to start them
        mine = []
        for _ in range(20):
            began = time.perf_counter()
            assert owned.exec(["true"], timeout=10).returncode == 0
            mine.append(time.perf_counter() - began)
    print(f"\nopenai-agents exec latency, median of 20 `true`: through the provider {statistics.median(through) * 1000:.1f} ms, "
          f"sb.exec on the same (detached) box {statistics.median(own) * 1000:.1f} ms, sb.exec on an owned box {statistics.median(mine) * 1000:.1f} ms")

    await other.delete(attached)
    assert gone(box_id)

    # Restored once it is gone: a new box, the workspace hydrated from the persisted tar, nothing else of the old box.
    restored = await other.resume(other.deserialize_session_state(dict(payload)))
    try:
        await restored.start()
        assert restored.state.box_id != box_id
        assert (await restored.read(Path("notes/a.bin"))).read() == data
        assert (await restored.exec("cat /tmp/marker")).exit_code == 1
        with pytest.raises(WorkspaceReadNotFoundError):
            await restored.read(Path("notes/missing"))
        with pytest.raises(ExecTimeoutError):
            await restored.exec("sleep 30", timeout=0.5)
        assert (await restored.exec("echo still up")).stdout == b"still up\n"  # a timeout ends the command, not the box
    finally:
        await other.delete(restored)


def test_resume_reattaches_to_a_living_box_and_restores_one_that_is_gone(tmp_path):
    asyncio.run(asyncio.wait_for(_resume_reattaches_then_restores(tmp_path), 120))


async def _checkpoint_restores_the_live_box(tmp_path: Path) -> None:
    client = QuineboxSandboxClient()
    session = await client.create(options=QuineboxSandboxClientOptions(runtime="runsc"), snapshot=LocalSnapshotSpec(base_path=tmp_path))
    await session.start()
    await session.write(Path("kept.txt"), io.BytesIO(b"in the workspace\n"))
    await session.exec("echo in memory > /tmp/marker")
    await session.stop()
    payload = client.serialize_session_state(session.state)
    assert payload["checkpoint_id"]
    await client.delete(session)

    restored = await client.resume(client.deserialize_session_state(payload))
    try:
        await restored.start()
        assert restored.state.box_id != payload["box_id"]
        assert (await restored.read(Path("kept.txt"))).read() == b"in the workspace\n"
        assert (await restored.exec("cat /tmp/marker")).stdout == b"in memory\n"  # the box's tmpfs: only a checkpoint has it
    finally:
        await client.delete(restored)
        for made in {payload["checkpoint_id"], restored.state.checkpoint_id} - {None}:  # checkpoints stay until removed
            subprocess.run([sys.executable, "-m", "quinebox", "box", "snapshots", "rm", made], check=True, capture_output=True, timeout=60)


def test_on_gvisor_a_persisted_session_is_a_checkpoint_that_resume_restores(tmp_path):
    asyncio.run(asyncio.wait_for(_checkpoint_restores_the_live_box(tmp_path), 120))


async def _accounts_are_the_images(tmp_path: Path) -> None:
    client = QuineboxSandboxClient()
    session = await client.create(manifest=Manifest(users=[User(name="agent")]), snapshot=LocalSnapshotSpec(base_path=tmp_path))
    try:
        await session.start()  # the agent image has `agent`: nothing to add
        assert (await session.exec("id -un", user=User(name="agent"))).stdout == b"agent\n"
    finally:
        await client.delete(session)
    refused = await client.create(manifest=Manifest(users=[User(name="mallory")]), snapshot=LocalSnapshotSpec(base_path=tmp_path))
    try:
        with pytest.raises(ValueError, match="user 'mallory' is not in the box's image"):
            await refused.start()
    finally:
        await client.delete(refused)


def test_a_manifests_users_must_be_the_images_and_a_missing_one_is_refused_in_one_line(tmp_path):
    asyncio.run(asyncio.wait_for(_accounts_are_the_images(tmp_path), 60))

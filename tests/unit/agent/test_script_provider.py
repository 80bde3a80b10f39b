"""The scripted model's YAML shorthands, and what it refuses."""

import json

import pytest

from quinebox.agent.providers import ProviderError
from quinebox.agent.providers.script import ScriptProvider, turn_message
from quinebox.errors import ErrorKind, QuineboxError


def calls(message):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls", [])]


@pytest.mark.parametrize(
    "turn, content, expected",
    [
        ({"sh": "ls"}, None, [("sh", {"command": "ls"})]),
        ({"exec": "note"}, None, [("exec", {"note": "note"})]),
        ({"exit": "success"}, None, [("exit", {"status": "success"})]),
        ({"exit": {"status": "failure", "reason": "r"}}, None, [("exit", {"status": "failure", "reason": "r"})]),
        ({"tool": "sh", "args": {"command": "x", "timeout": 3}}, None, [("sh", {"command": "x", "timeout": 3})]),
        ({"say": "hello"}, "hello", []),
        ({"say": "and", "sh": "pwd"}, "and", [("sh", {"command": "pwd"})]),
    ],
)
def test_turn_shapes(turn, content, expected):
    message = turn_message(0, turn)
    assert message["role"] == "assistant" and message["content"] == content
    assert calls(message) == expected


def test_raw_string_arguments_pass_untouched_for_malformed_cases():
    assert turn_message(0, {"tool": "sh", "args": "{broken"})["tool_calls"][0]["function"]["arguments"] == "{broken"


def test_turns_are_taken_in_order_and_running_out_is_a_provider_error(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("turns:\n  - sh: one\n  - exit: success\n")
    provider = ScriptProvider(str(path))
    assert calls(provider.complete([{"role": "user", "content": "x"}], []).message) == [("sh", {"command": "one"})]
    second = provider.complete([{"role": "user", "content": "x"}], [])
    assert calls(second.message) == [("exit", {"status": "success"})]
    assert second.usage["total_tokens"] == second.usage["prompt_tokens"] + second.usage["completion_tokens"]
    with pytest.raises(ProviderError, match="no turn 3"):
        provider.complete([], [])


@pytest.mark.parametrize("text", ["turns: 5", "- a\n- b", "turns: [1, 2]", ": : :"])  # not a list of mappings; not YAML
def test_bad_scripts_are_refused_at_start(tmp_path, text):
    path = tmp_path / "m.yaml"
    path.write_text(text)
    with pytest.raises(QuineboxError) as bad:
        ScriptProvider(str(path))
    assert (bad.value.kind, dict(bad.value.fields)) == (ErrorKind.BAD_INPUT, {"path": str(path)})


def test_missing_script(tmp_path):
    with pytest.raises(QuineboxError) as missing:
        ScriptProvider(str(tmp_path / "nope.yaml"))
    assert (missing.value.kind, dict(missing.value.fields)) == (ErrorKind.NOT_FOUND, {"path": str(tmp_path / "nope.yaml")})


def test_a_resumed_session_goes_on_after_the_turns_its_model_had_given(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("turns:\n  - sh: one\n  - sh: two\n  - exit: success\n")
    provider = ScriptProvider(str(path), start=2)
    assert calls(provider.complete([], []).message) == [("exit", {"status": "success"})]


def test_a_replay_pairs_a_turn_asked_again_after_a_resume_once(tmp_path):
    """A turn asked again (its first asking lost with its process) has one answer: the replay has one model call for it."""
    from quinebox.agent.providers.replay import ReplayProvider, digest
    from quinebox.agent.store import Tape

    first, second = [{"role": "user", "content": "Begin."}], [{"role": "user", "content": "Begin."}, {"role": "assistant", "content": "a"}]
    tape = Tape("unit-replayed")
    tape.append("meta", session="unit-replayed", mission="m", model="script:x")
    tape.append("request", turn=1, cycle=0, digest=digest(first), messages=first)
    tape.append("response", turn=1, message={"role": "assistant", "content": "a"}, usage={"total_tokens": 2})
    tape.append("request", turn=2, cycle=0, digest=digest(second), messages=second[1:])
    tape.append("resumed", turn=2, cycle=0, material=0, owner="h:1:2", answered=False)
    tape.append("request", turn=2, cycle=0, digest=digest(second), messages=[])
    tape.append("response", turn=2, message={"role": "assistant", "content": "b"}, usage={"total_tokens": 3})
    tape.close()
    replayed = ReplayProvider("unit-replayed")
    assert [replayed.complete(m, []).message["content"] for m in (first, second)] == ["a", "b"]
    with pytest.raises(ProviderError, match="the recording has 2 model calls"):
        replayed.complete(second, [])
    assert ReplayProvider("unit-replayed", start=1).complete(second, []).message["content"] == "b"

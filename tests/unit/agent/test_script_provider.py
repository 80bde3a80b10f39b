"""The scripted model's YAML shorthands, and what it refuses."""

import json

import pytest

from quinebox.agent.providers import ProviderError
from quinebox.agent.providers.script import ScriptProvider, turn_message
from quinebox.errors import QuineboxError


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


@pytest.mark.parametrize("text, words", [("turns: 5", "list of mappings"), ("- a\n- b", "list of mappings"), ("turns: [1, 2]", "list of mappings"), (": : :", "cannot read")])
def test_bad_scripts_are_refused_at_start(tmp_path, text, words):
    path = tmp_path / "m.yaml"
    path.write_text(text)
    with pytest.raises(QuineboxError, match=words):
        ScriptProvider(str(path))


def test_missing_script(tmp_path):
    with pytest.raises(QuineboxError, match="not found"):
        ScriptProvider(str(tmp_path / "nope.yaml"))

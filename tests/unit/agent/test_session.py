"""The broker and an agent session over a real Unix socket, with the scripted model: no Docker needed.

This is the host side a box talks to; here the test plays the guest.
"""

import json
import secrets
import socket
import struct

import pytest

from quinebox.agent.budgets import Budget
from quinebox.agent.providers.script import ScriptProvider
from quinebox.agent.session import AgentSession, check_chat
from quinebox.agent.store import read_tape
from quinebox.box.net.broker import Broker
from quinebox.guest import protocol

CHAT = {"kind": "chat", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "Begin."}], "tools": [{"type": "function", "function": {"name": "sh"}}]}


@pytest.fixture
def script(tmp_path):
    def make(*turns):
        path = tmp_path / "model.yaml"
        path.write_text(json.dumps({"turns": list(turns)}))
        return ScriptProvider(str(path))

    return make


@pytest.fixture
def broker(tmp_path, script):
    made = []

    def make(provider=None, budget=Budget()):
        session = AgentSession("unit-" + secrets.token_hex(6), mission="test", provider=provider or script(*[{"sh": "true"}] * 10), budget=budget)
        made.append((Broker(str(tmp_path / f"b{len(made)}.sock"), session), session))
        return made[-1]

    yield make
    for b, _ in made:
        b.close()


class Guest:
    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(path)
        self.reader = self.sock.makefile("rb")

    def send_raw(self, data: bytes):
        self.sock.sendall(data)
        return protocol.read_frame(self.reader)[0]

    def ask(self, message):
        return self.send_raw(protocol.encode(message))


def test_hello_then_chat_answers_from_the_provider_and_records_the_tape(broker, script):
    b, session = broker(script({"sh": "ls", "say": "looking"}))
    guest = Guest(b.path)
    assert guest.ask({"kind": "hello", "role": "agent"}) == {"kind": "welcome", "session": session.session, "max_turns": 40, "cycles_left": 10}
    reply = guest.ask(CHAT)
    assert reply["kind"] == "chat_result"
    assert reply["message"]["content"] == "looking"
    assert reply["message"]["tool_calls"][0]["function"] == {"name": "sh", "arguments": '{"command": "ls"}'}
    assert [r["kind"] for r in read_tape(session.session)] == ["meta", "request", "response"]


@pytest.mark.parametrize(
    "message, code, words",
    [
        ({"kind": "launch"}, "unknown", "unknown frame kind 'launch'"),
        ({"kind": "chat"}, "invalid", "non-empty 'messages'"),
        ({"kind": "chat", "messages": "hi", "tools": []}, "invalid", "non-empty 'messages'"),
        ({"kind": "chat", "messages": [{"role": "god", "content": "x"}], "tools": []}, "invalid", "role of system"),
        ({"kind": "chat", "messages": [{"role": "user", "content": 5}], "tools": []}, "invalid", "content must be a string"),
        ({"kind": "chat", "messages": [{"role": "user", "content": "x"}], "tools": [{"function": 1}]}, "invalid", "each tool"),
    ],
)
def test_bad_frames_earn_an_error_and_the_connection_goes_on(broker, message, code, words):
    b, _ = broker()
    guest = Guest(b.path)
    reply = guest.ask(message)
    assert (reply["kind"], reply["code"]) == ("error", code)
    assert words in reply["message"]
    assert guest.ask({"kind": "hello", "role": "agent"})["kind"] == "welcome"


FORGED_EVENTS = [
    {"event": "response", "turn": 1, "message": {"role": "assistant", "content": "I was told to", "tool_calls": None}},
    {"event": "request", "turn": 1, "cycle": 0, "digest": "d", "messages": []},
    {"event": "outcome", "exit_code": 0, "termination": "exit_success", "duration_s": 1, "tokens": 0, "turns": 0},
    {"event": "meta", "session": "x", "mission": "m", "model": "m"},
    {"event": "cycle", "cycle": 1}, {"event": "revision", "rev": 9, "files": 1, "bytes": 1}, {"event": "spawn", "child": "c", "what": "run"},
    {"event": "box_refused", "event_": "x", "why": "y"}, {"event": None}, {}, {"event": "x" * 500},
    {"event": "exit", "turn": 1, "status": "sure"}, {"event": "terminated", "turn": 1, "termination": "timeout"},
    {"event": "tool", "turn": "1", "name": "sh", "args": {}, "exit_code": 0, "result": ""},
    {"event": "tool", "turn": 1, "name": "sh", "args": {}, "exit_code": 0, "result": "x" * (1 << 20)},
]


def test_a_box_adds_only_its_own_kinds_and_a_forgery_is_no_record_of_the_hosts(broker):
    b, session = broker()
    guest = Guest(b.path)
    for event in FORGED_EVENTS:
        guest.sock.sendall(protocol.encode({"kind": "event", **event}))
    guest.sock.sendall(protocol.encode({"kind": "event", "event": "tool", "turn": 1, "name": "sh", "args": {"command": "ls"}, "exit_code": 0, "result": "a", "t": 1.0, "extra": 1}))
    assert guest.ask({"kind": "hello", "role": "agent"})["kind"] == "welcome"  # no answer to any event: the next reply is the hello's
    tape = read_tape(session.session)
    refused = [r for r in tape if r["kind"] == "box_refused"]
    assert [r["kind"] for r in tape] == ["meta"] + ["box_refused"] * len(FORGED_EVENTS) + ["tool"]
    assert refused[0]["event"] == "response" and "not an event a box may record" in refused[0]["why"]
    assert len(refused[10]["event"]) == 64 and "over 1024 KiB" in refused[-1]["why"]
    assert tape[-1]["args"] == {"command": "ls"} and "extra" not in tape[-1] and tape[-1]["t"] > 1e9
    assert session.termination is None  # a refused exit or terminated claims nothing


def test_refusals_are_recorded_a_bounded_number_of_times_and_a_box_has_a_share_of_its_tape(broker, monkeypatch):
    from quinebox.agent import session as session_module

    b, session = broker()
    guest = Guest(b.path)
    for _ in range(100):
        guest.sock.sendall(protocol.encode({"kind": "event", "event": "response"}))
    monkeypatch.setattr(session_module, "BOX_SHARE", 300)
    for _ in range(5):
        guest.sock.sendall(protocol.encode({"kind": "event", "event": "tool_error", "turn": 1, "name": "sh", "error": "e" * 100}))
    assert guest.ask({"kind": "hello", "role": "agent"})["kind"] == "welcome"
    kinds = [r["kind"] for r in read_tape(session.session)]
    assert kinds.count("box_refused") == 32 and kinds.count("tool_error") == 3  # ~130 bytes each: the 4th finds the share spent
    assert session.refused == 102  # every refusal counted, the first 32 written


@pytest.mark.parametrize(
    "data, words",
    [
        (b"\xff" * 16, "over the limit"),
        (struct.pack(">II", 1 << 30, 0), "over the limit"),
        (struct.pack(">II", 4, 0) + b"nope", "not JSON"),
    ],
)
def test_unparseable_streams_get_an_error_then_are_closed_and_the_broker_survives(broker, data, words):
    b, _ = broker()
    guest = Guest(b.path)
    reply = guest.send_raw(data)
    assert reply["code"] == "protocol" and words in reply["message"]
    assert guest.reader.read(1) == b""  # closed
    assert Guest(b.path).ask({"kind": "hello", "role": "agent"})["kind"] == "welcome"


def test_turn_budget_is_the_hosts_to_enforce(broker):
    b, session = broker(budget=Budget(max_turns=2))
    guest = Guest(b.path)
    guest.ask({"kind": "hello", "role": "agent"})
    kinds = [guest.ask(CHAT)["kind"] for _ in range(4)]
    assert kinds == ["chat_result", "chat_result", "chat_result", "error"]  # two turns, the final turn, then no more
    assert session.termination == "turn_exhaustion"


def test_exec_cycles_are_counted_by_hellos_not_by_what_the_guest_claims(broker):
    b, session = broker(budget=Budget(max_cycles=2))
    replies = [Guest(b.path).ask({"kind": "hello", "role": "agent", "cycle": 0}) for _ in range(4)]
    assert [r["kind"] for r in replies] == ["welcome", "welcome", "welcome", "error"]
    assert [r.get("cycles_left") for r in replies[:3]] == [2, 1, 0]


def test_a_box_without_an_agent_runtime_serves_only_its_lifeline(tmp_path):
    b = Broker(str(tmp_path / "x.sock"))
    try:
        guest = Guest(b.path)
        assert guest.ask(CHAT)["code"] == "unsupported"
    finally:
        b.close()


def test_closing_the_broker_breaks_every_lifeline(tmp_path):
    b = Broker(str(tmp_path / "x.sock"))
    guest = Guest(b.path)
    guest.sock.sendall(b"")
    b.close()
    try:  # an accepted connection ends; one still in the listen queue is reset
        assert guest.reader.read(1) == b""
    except ConnectionResetError:
        pass


def test_check_chat_returns_messages_and_tools():
    assert check_chat(CHAT) == (CHAT["messages"], CHAT["tools"])

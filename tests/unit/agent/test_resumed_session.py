"""A resumed session on the host, over a real socket with the scripted model: the test plays the guest.

It goes on with the tape its lost process left: the guest is told the conversation and the turn in flight, the
counts go on, the tape gets one `resumed` record and no message twice, and the material's count goes on from what
was passed over. A guest too old to go on is refused, and the session stays interrupted.
"""

from __future__ import annotations

import json
import secrets

import pytest
from test_session import CHAT, Guest

from quinebox.agent.budgets import Budget, TokenPool
from quinebox.agent.providers.replay import digest
from quinebox.agent.providers.script import ScriptProvider
from quinebox.agent.resumption import resumption
from quinebox.agent.session import AgentSession
from quinebox.agent.store import Index, read_records, read_tape
from quinebox.box.net.broker import Broker

OWNER = "elsewhere:1:2"


@pytest.fixture
def lost(tmp_path):
    """A session that asked two turns (the answer to the second on its tape when `answered`) and was then lost."""
    model = tmp_path / "model.yaml"
    model.write_text(json.dumps({"turns": [{"sh": "one"}, {"sh": "two"}, {"sh": "three"}, {"exit": "success"}]}))
    brokers = []

    def make(answered: bool):
        session = AgentSession("unit-" + secrets.token_hex(6), mission="m", provider=ScriptProvider(str(model)), budget=Budget(), owner="gone:1:1")
        broker = Broker(str(tmp_path / f"{session.session}.sock"), session)
        brokers.append(broker)
        guest = Guest(broker.path)
        guest.ask({"kind": "hello", "role": "agent", "resume": True})
        first = guest.ask({**CHAT, "material": 3})
        messages = [*CHAT["messages"], first["message"], {"role": "tool", "tool_call_id": "call_0", "content": "ran one"}]
        if answered:
            guest.ask({**CHAT, "messages": messages, "material": 5})
        else:  # lost while the model was asked: the request is on the tape, no answer
            session.tape.append("request", turn=2, cycle=0, digest=digest(messages), messages=messages[len(CHAT["messages"]) + 1 :], material=5)
        session.tape.close()
        session.index.close()
        return session.session, messages, str(model)

    yield make
    for broker in brokers:
        broker.close()


def go_on(tmp_path, session: str, model: str, budget: Budget | None = None) -> tuple[AgentSession, Guest, Broker]:
    point = resumption(read_records(session))
    resumed = AgentSession(session, mission="m", provider=ScriptProvider(model, start=point.answers), budget=budget or Budget(), owner=OWNER, resumption=point)
    broker = Broker(str(tmp_path / f"again-{session}.sock"), resumed)
    return resumed, Guest(broker.path), broker


def test_the_guest_is_told_where_it_was_and_the_recorded_answer_is_taken_again(lost, tmp_path):
    session, messages, model = lost(answered=True)
    resumed, guest, broker = go_on(tmp_path, session, model)
    try:
        welcome = guest.ask({"kind": "hello", "role": "agent", "resume": True})
        assert welcome["resume"]["messages"] == messages and welcome["resume"]["turn"] == 1 and welcome["resume"]["cycle"] == 0
        assert welcome["resume"]["answer"]["message"]["tool_calls"][0]["function"]["arguments"] == '{"command": "two"}'
        reply = guest.ask({**CHAT, "messages": [*messages, welcome["resume"]["answer"]["message"], {"role": "tool", "content": "ran two"}], "material": 4})
        assert reply["turn"] == 3 and reply["message"]["tool_calls"][0]["function"]["arguments"] == '{"command": "three"}'  # the script goes on
        resumed.finish(0)
    finally:
        broker.close()
    tape = read_tape(session)
    assert [r["kind"] for r in tape] == ["meta", "request", "response", "request", "response", "resumed", "request", "response", "outcome"]
    assert tape[5] == {**tape[5], "turn": 2, "answered": True, "material": 5, "owner": OWNER}
    assert tape[6]["turn"] == 3 and tape[6]["messages"] == [{"role": "tool", "content": "ran two"}]
    assert tape[6]["material"] == 5 + 4  # what was passed over, and what the new box counted after it
    assert tape[-1]["turns"] == 3 and tape[-1]["tokens"] == sum(r["usage"]["total_tokens"] for r in tape if r["kind"] == "response")


def test_without_a_recorded_answer_the_turn_is_asked_again_and_no_message_is_recorded_twice(lost, tmp_path):
    session, messages, model = lost(answered=False)
    resumed, guest, broker = go_on(tmp_path, session, model)
    try:
        welcome = guest.ask({"kind": "hello", "role": "agent", "resume": True})
        assert welcome["resume"]["answer"] is None and welcome["resume"]["turn"] == 1
        reply = guest.ask({**CHAT, "messages": messages, "material": 0})
        assert reply["turn"] == 2 and reply["message"]["tool_calls"][0]["function"]["arguments"] == '{"command": "two"}'
        resumed.finish(0)
    finally:
        broker.close()
    asked = [r for r in read_tape(session) if r["kind"] == "request"]
    assert [(r["turn"], len(r["messages"])) for r in asked] == [(1, 2), (2, 1), (2, 0)]
    assert asked[2]["digest"] == asked[1]["digest"] == digest(messages) and asked[2]["material"] == 5


def test_the_turn_budget_and_the_token_budget_go_on_as_spent(lost, tmp_path):
    session, messages, model = lost(answered=True)
    spent = resumption(read_records(session)).tokens
    resumed, guest, broker = go_on(tmp_path, session, model, Budget(max_turns=2, tokens=TokenPool(spent + 1)))
    resumed.budget.tokens.spend(spent)
    try:
        guest.ask({"kind": "hello", "role": "agent", "resume": True})
        more = [*messages, {"role": "assistant", "content": "x"}, {"role": "tool", "content": "y"}]
        assert guest.ask({**CHAT, "messages": more})["kind"] == "chat_result"  # turn 3: one token was left, enough to ask
        refused = guest.ask({**CHAT, "messages": more})
        assert refused["kind"] == "error" and refused["code"] == "budget"
    finally:
        broker.close()


def test_a_guest_too_old_to_go_on_is_refused_and_the_session_stays_interrupted(lost, tmp_path):
    session, _, model = lost(answered=True)
    resumed, guest, broker = go_on(tmp_path, session, model)
    try:
        refused = guest.ask({"kind": "hello", "role": "agent"})
        assert refused["kind"] == "error" and refused["exit_code"] == 125 and "quinebox image build" in refused["message"]
        assert resumed.finish(125)["termination"] == "not_resumed"
    finally:
        broker.close()
    assert [r["kind"] for r in read_tape(session)][-1] == "resumed"  # no outcome
    index = Index()
    try:
        row = index.get(session)
        assert row is not None and row.ended is None and index.owners([session]) == {session: OWNER}
    finally:
        index.close()


def test_the_index_says_whose_a_session_is_and_which_were_interrupted():
    index = Index()
    try:
        index.start("unit-live", parent=None, mission="m", model="x", owner=_me())
        index.start("unit-dead", parent=None, mission="m", model="x", owner=f"{_host()}:999999999:1")
        index.start("unit-unknown", parent=None, mission="m", model="x")
        rows = [r for r in (index.get(s) for s in ("unit-live", "unit-dead", "unit-unknown")) if r is not None]
        assert index.interrupted(rows) == {"unit-dead"}
        index.finish("unit-dead", exit_code=0, termination="exit_success", tokens=0, turns=0)
        assert index.interrupted([r for r in (index.get(s) for s in ("unit-dead",)) if r is not None]) == set()
        index.claim("unit-live", "other:1:1")
        assert index.owners(["unit-live", "unit-unknown"]) == {"unit-live": "other:1:1"}
        index.forget(["unit-live"], 1.0)
        assert index.owners(["unit-live"]) == {}
    finally:
        index.close()


def _me() -> str:
    from quinebox.processes import owner_id

    return owner_id()


def _host() -> str:
    import socket

    return socket.gethostname()

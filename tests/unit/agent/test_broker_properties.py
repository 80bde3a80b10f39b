"""Whatever a box sends its host's socket, the host answers with frames or closes the connection; it never crashes.

A real broker on a real Unix socket, an agent session with the scripted model,
and the tree's node as the spawner (its box holds no spawn grant), against
generated frames: known kinds with fields of any JSON shape, raw garbage after
them, and connections cut at any point.
"""

import secrets
import select
import socket
import threading

import pytest
from commands import wait_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quinebox.agent.budgets import Budget
from quinebox.agent.providers.script import ScriptProvider
from quinebox.agent.session import AgentSession
from quinebox.box.net.broker import MAX_CONNECTIONS, Broker
from quinebox.box.spec import build_spec
from quinebox.guest import protocol
from quinebox.tree.supervisor import Node

KINDS = ["hello", "chat", "event", "revise", "restore_world", "adopt", "spawn", "stdin", "kill", "exit", "world_plan", "", "x" * 300]
REPLIES = {"welcome", "chat_result", "revised", "error", "world_plan", "world_data"}
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
FIELDS = ["role", "messages", "tools", "turn", "cycle", "what", "command", "revision", "session", "force", "argv", "mission", "grants",
          "timeout", "workdir", "cwd", "world", "image", "model", "detach", "max_turns", "eof"]
MESSAGE = st.builds(lambda kind, fields: {**fields, "kind": kind}, st.sampled_from(KINDS), st.dictionaries(st.sampled_from(FIELDS), JSON, max_size=6))


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("broker")
    script = tmp / "model.yaml"
    script.write_text('{"turns": [' + ", ".join(['{"sh": "true"}'] * 1000) + "]}")
    session = AgentSession("fuzz-" + secrets.token_hex(6), mission="m", provider=ScriptProvider(str(script)), budget=Budget(max_turns=10**6, max_cycles=10**6))
    node = Node.root(build_spec(["true"], cwd=str(tmp)))
    node.session = session
    broker = Broker(str(tmp / "host.sock"), session, node)
    crashes: list = []
    previous = threading.excepthook
    threading.excepthook = lambda args: crashes.append(args.exc_value)
    yield broker, crashes
    threading.excepthook = previous
    broker.close()


def exchange(path: str, data: bytes) -> list:
    """Send `data`, end our side, and read every frame the host sends until it closes."""
    with socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(20)
        conn.connect(path)
        try:
            conn.sendall(data)
            conn.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the host closed first, on a frame it could not trust
        reader = conn.makefile("rb")
        replies = []
        while True:
            try:
                replies.append(protocol.read_frame(reader)[0])
            except (EOFError, ConnectionError):
                return replies


def still_serving(path: str) -> bool:
    return exchange(path, protocol.encode({"kind": "hello", "role": "agent"}))[0]["kind"] in ("welcome", "error")


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(MESSAGE, st.binary(max_size=256)), min_size=1, max_size=5), st.binary(max_size=64))
def test_frames_of_any_shape_get_frames_back_and_never_a_crash(host, messages, garbage):
    broker, crashes = host
    data = b"".join(protocol.encode(message, payload) for message, payload in messages) + garbage
    for reply in exchange(broker.path, data):
        assert reply["kind"] in REPLIES, reply
        if reply["kind"] == "error":
            assert isinstance(reply["code"], str) and isinstance(reply["message"], str)
    assert crashes == []
    assert still_serving(broker.path)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=2048))
def test_raw_bytes_get_at_most_error_frames(host, data):
    broker, crashes = host
    assert all(reply["kind"] == "error" for reply in exchange(broker.path, data))
    assert crashes == [] and still_serving(broker.path)


def test_a_flood_of_connections_is_served_a_cap_at_a_time_and_the_rest_wait_unreset(host):
    """Connections that carry no child are served MAX_CONNECTIONS at a time (a thread each): the host accepts no more
    until one is done, so the rest wait in the kernel's queue with their frames unread, and each is answered once
    there is room. Before, they were closed on arrival, and a box's legitimate connect past the cap was reset."""
    broker, crashes = host
    wait_for(lambda: broker.connections() == 0, what="the earlier tests' connections to be done")
    hello = protocol.encode({"kind": "hello", "role": "agent"})
    held, waiting = [], []
    for _ in range(MAX_CONNECTIONS):
        held.append(socket.socket(socket.AF_UNIX))
        held[-1].connect(broker.path)
    wait_for(lambda: broker.connections() == MAX_CONNECTIONS, what="the cap's worth to be served")
    for _ in range(8):  # within the listener's backlog: their connects return, nothing accepts them
        waiting.append(socket.socket(socket.AF_UNIX))
        waiting[-1].settimeout(20)
        waiting[-1].connect(broker.path)
        waiting[-1].sendall(hello)
    held[0].settimeout(20)
    held[0].sendall(hello)  # a served one is answered meanwhile: the host is not stuck, it is full
    assert protocol.read_frame(held[0].makefile("rb"))[0]["kind"] == "welcome"
    readable, _, _ = select.select(waiting, [], [], 0.3)
    assert (readable, broker.connections()) == ([], MAX_CONNECTIONS)
    for conn in held:
        conn.close()
    for conn in waiting:  # each answered once there is room, none reset
        assert protocol.read_frame(conn.makefile("rb"))[0]["kind"] == "welcome"
        conn.close()
    assert crashes == [] and still_serving(broker.path)

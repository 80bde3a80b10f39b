"""OpenTelemetry traces of real runs, sent to an OTLP/HTTP receiver of the tests' own on loopback.

The receiver decodes each ExportTraceServiceRequest with opentelemetry-proto, as a collector would, and keeps
the raw bytes too: what the tests say is absent is absent from every byte sent. (Named apart from
tests/unit/view/test_traces.py: the two would share a module name.)
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from commands import qb, scripts
from openai_server import exit_, sh

from quinebox.agent.store import Index, read_tape

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
OTEL_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SDK_DISABLED")


class Receiver:
    """An OTLP/HTTP traces endpoint: every request's bytes, and its spans decoded."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest, ExportTraceServiceResponse

        self.bodies: list[bytes] = []
        self.paths: list[str] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                ExportTraceServiceRequest.FromString(body)  # a request a collector could not decode fails the test below
                with receiver._lock:
                    receiver.bodies.append(body)
                    receiver.paths.append(self.path)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def clear(self) -> None:
        with self._lock:
            self.bodies.clear()
            self.paths.clear()

    def spans(self) -> list[dict[str, Any]]:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        found = []
        for body in self.bodies:
            for resource in ExportTraceServiceRequest.FromString(body).resource_spans:
                service = {a.key: value(a.value) for a in resource.resource.attributes}
                for scope in resource.scope_spans:
                    for span in scope.spans:
                        found.append({
                            "name": span.name, "trace": span.trace_id.hex(), "id": span.span_id.hex(), "parent": span.parent_span_id.hex(),
                            "start": span.start_time_unix_nano / 1e9, "end": span.end_time_unix_nano / 1e9, "kind": span.kind,
                            "error": span.status.message if span.status.code == 2 else None, "service": service.get("service.name"),
                            "attributes": {a.key: value(a.value) for a in span.attributes},
                        })
        return found


def value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


@pytest.fixture(scope="module")
def receiver():
    found = Receiver()
    yield found
    found.server.shutdown()


@pytest.fixture
def otlp(receiver):
    receiver.clear()
    return receiver


def plain_env(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k not in OTEL_VARIABLES}, **extra}


def summary(stderr: bytes) -> dict[str, Any]:
    """The --json summary: still the last line when traces were exported."""
    return json.loads(stderr.decode().splitlines()[-1])


class Tree:
    """The received spans, by id, with a way up."""

    def __init__(self, spans: list[dict[str, Any]]):
        self.spans = spans
        self.by_id = {s["id"]: s for s in spans}

    def parent(self, span: dict[str, Any]) -> dict[str, Any] | None:
        return self.by_id.get(span["parent"])

    def children(self, span: dict[str, Any], name: str | None = None) -> list[dict[str, Any]]:
        return sorted((s for s in self.spans if s["parent"] == span["id"] and (name is None or s["name"] == name)), key=lambda s: s["start"])

    def up_to(self, span: dict[str, Any], prefix: str) -> dict[str, Any]:
        at = self.parent(span)
        while at is not None and not at["name"].startswith(prefix):
            at = self.parent(at)
        assert at is not None, f"no {prefix} above {span['name']}"
        return at

    def agent(self, session: str) -> dict[str, Any]:
        [span] = [s for s in self.spans if s["name"] == "invoke_agent quinebox" and s["attributes"]["gen_ai.agent.id"] == session]
        return span


def test_a_run_is_one_trace_of_box_agent_turns_calls_and_its_child_box_with_no_secret_or_key(otlp, fake_openai):
    secret = "real-secret-" + os.urandom(12).hex()
    fake_openai.steps = [sh("echo $API_TOKEN >&5; quinebox exec -- echo child >&4", usage=(123, 45)), exit_()]
    env = plain_env(OTEL_EXPORTER_OTLP_ENDPOINT=otlp.url, API_TOKEN=secret)
    grants = ["-g", "net:api.test", "-g", "secret:API_TOKEN@api.test", "-g", "spawn:1", "-g", "depth:1"]
    done = qb("run", "-q", "--json", *grants, "count the regions", env=env)
    assert (done.returncode, done.stdout) == (0, b"child\n"), done.stderr
    session = summary(done.stderr)["session"]
    assert otlp.paths == ["/v1/traces"]
    tree = Tree(otlp.spans())
    assert len({s["trace"] for s in tree.spans}) == 1 and {s["service"] for s in tree.spans} == {"quinebox"}
    [root] = [s for s in tree.spans if not s["parent"]]
    assert (root["name"], root["attributes"]["quinebox.session"], root["attributes"]["quinebox.box.kind"]) == ("box", session, "agent")
    assert "secret:API_TOKEN@api.test" in root["attributes"]["quinebox.grants"]  # a grant names its variable, never its value
    agent = tree.agent(session)
    assert tree.parent(agent) is root and agent["attributes"]["gen_ai.request.model"] == "test-model"
    turns = tree.children(agent)
    assert [t["name"] for t in turns] == ["turn 1", "turn 2"]
    assert [[s["name"] for s in tree.children(t)] for t in turns] == [["chat test-model", "execute_tool sh"], ["chat test-model", "execute_tool exit"]]
    answers = [r for r in read_tape(session) if r["kind"] == "response"]
    chats = [tree.children(t, "chat test-model")[0] for t in turns]
    assert [(c["attributes"]["gen_ai.usage.input_tokens"], c["attributes"]["gen_ai.usage.output_tokens"]) for c in chats] == [
        (r["usage"]["prompt_tokens"], r["usage"]["completion_tokens"]) for r in answers
    ] == [(123, 45), (10, 5)]
    assert chats[0]["attributes"]["gen_ai.response.finish_reasons"] == ["tool_calls"] and chats[0]["kind"] == 3  # SPAN_KIND_CLIENT
    [call] = tree.children(turns[0], "execute_tool sh")
    assert call["attributes"]["gen_ai.tool.call.id"] == answers[0]["message"]["tool_calls"][0]["id"]
    [child] = tree.children(call)
    assert (child["name"], child["attributes"]["quinebox.box.kind"], child["attributes"]["process.exit.code"]) == ("box", "command", 0)
    assert root["start"] <= agent["start"] <= turns[0]["start"] <= call["start"] <= child["start"] <= child["end"] <= call["end"] <= root["end"]
    sent = b"".join(otlp.bodies)
    assert secret.encode() not in sent and os.environ["OPENAI_API_KEY"].encode() not in sent
    assert b"echo child" not in sent and b"quinebox-secret-API_TOKEN" not in sent  # no tool argument, no content


def test_the_36_session_tree_has_each_agent_under_the_fork_that_started_it(otlp):
    env = plain_env(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=otlp.url + "/v1/traces")
    done = qb("run", "--otel", "-q", "--json", "-m", f"script:{EXAMPLES / 'tree' / 'root.yaml'}", "-g", "spawn:35", "-g", "depth:2",
              "Survey the ten regions", env=env, timeout=300)
    assert (done.returncode, done.stdout) == (0, b"surveyed 10 regions with 36 agents\n"), done.stderr
    session = summary(done.stderr)["session"]
    index = Index()
    rows = index.subtree(session)
    index.close()
    tree = Tree(otlp.spans())
    assert len(rows) == 36 and len({s["trace"] for s in tree.spans}) == 1
    assert len([s for s in tree.spans if s["name"] == "invoke_agent quinebox"]) == 36
    for row in rows:
        agent = tree.agent(row.id)
        box = tree.parent(agent)
        assert (box["name"], box["attributes"]["quinebox.session"]) == ("box", row.id)
        chats = [s for s in tree.spans if s["name"].startswith("chat ") and tree.up_to(s, "invoke_agent")["id"] == agent["id"]]
        assert sum(c["attributes"]["gen_ai.usage.input_tokens"] + c["attributes"]["gen_ai.usage.output_tokens"] for c in chats) == row.tokens
        assert (agent["attributes"]["quinebox.tokens"], agent["attributes"]["quinebox.turns"]) == (row.tokens, row.turns)
        if row.parent is None:
            assert not box["parent"]
            continue
        fork = tree.parent(box)
        assert (fork["name"], fork["attributes"]["gen_ai.tool.name"]) == ("execute_tool fork", "fork")
        assert tree.up_to(fork, "invoke_agent")["attributes"]["gen_ai.agent.id"] == row.parent


def test_an_unreachable_collector_changes_neither_exit_status_nor_output(tmp_path):
    script = scripts(tmp_path, failing=[{"sh": "echo partial >&4"}, {"exit": "failure"}])
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{probe.getsockname()[1]}"  # closed once the block ends: nothing listens there
    argv = ("run", "-q", "-m", f"script:{script / 'failing.yaml'}", "fail after writing")
    plain = qb(*argv, env=plain_env())
    began = time.monotonic()
    traced = qb(*argv, env=plain_env(OTEL_EXPORTER_OTLP_ENDPOINT=nowhere))
    took = time.monotonic() - began
    assert (traced.returncode, traced.stdout) == (plain.returncode, plain.stdout) == (1, b"partial\n")
    extra = [line for line in traced.stderr.decode().splitlines() if line not in plain.stderr.decode().splitlines()]
    assert len(extra) == 1 and extra[0].startswith("quinebox: traces: could not export") and nowhere in extra[0], traced.stderr
    assert took < 30


def test_trace_exports_a_recorded_session_after_the_fact(otlp, tmp_path):
    script = scripts(tmp_path, quick=[{"sh": "echo ok >&4"}, {"exit": "success"}])
    done = qb("run", "-q", "--json", "-m", f"script:{script / 'quick.yaml'}", "say ok", env=plain_env())
    session = summary(done.stderr)["session"]
    assert done.returncode == 0 and otlp.bodies == []  # no --otel, no endpoint in the environment: nothing sent
    traced = qb("trace", session[:8], "--endpoint", otlp.url, env=plain_env())
    assert traced.returncode == 0, traced.stderr
    spans = otlp.spans()
    assert traced.stdout.decode().split() == [spans[0]["trace"]]
    assert sorted(s["name"] for s in spans) == sorted(["box", "invoke_agent quinebox", "turn 1", "turn 2", f"chat script:{script / 'quick.yaml'}",
                                                        f"chat script:{script / 'quick.yaml'}", "execute_tool sh", "execute_tool exit"])
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{probe.getsockname()[1]}/v1/traces"
    failed = qb("trace", session, "--endpoint", nowhere, env=plain_env())
    assert failed.returncode == 1 and len(failed.stderr.decode().splitlines()) == 1 and failed.stdout == b""


def test_map_is_one_trace_with_each_input_under_the_run(otlp, tmp_path):
    script = scripts(tmp_path, copy=[{"sh": "cat <&3 >&4"}, {"exit": "success"}])
    for name in ("one.txt", "two.txt"):
        (tmp_path / name).write_text(name)
    done = qb("map", "--otel", "-o", str(tmp_path / "out"), "-m", f"script:{script / 'copy.yaml'}", "copy it",
              str(tmp_path / "one.txt"), str(tmp_path / "two.txt"), env=plain_env(OTEL_EXPORTER_OTLP_ENDPOINT=otlp.url))
    assert done.returncode == 0, done.stderr
    tree = Tree(otlp.spans())
    [run] = [s for s in tree.spans if not s["parent"]]
    assert (run["name"], run["attributes"]["quinebox.run.inputs"], run["error"]) == ("map", 2, None)
    boxes = tree.children(run)
    assert sorted(b["attributes"]["quinebox.input"] for b in boxes) == ["one.txt", "two.txt"]
    assert all(b["name"] == "box" and tree.children(b, "invoke_agent quinebox") for b in boxes)
    assert len({s["trace"] for s in tree.spans}) == 1


@pytest.fixture
def without_the_extra(tmp_path):
    """An `opentelemetry` that cannot be imported, first on the path, and the file it leaves when anything tries."""
    shadow = tmp_path / "shadow" / "opentelemetry"
    shadow.mkdir(parents=True)
    marker = tmp_path / "imported"
    (shadow / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\nraise ImportError('no opentelemetry here')\n")
    return {"PYTHONPATH": str(shadow.parent), "QUINEBOX_SERVE": "off"}, marker  # a command server would have its own path


def test_the_plain_path_never_imports_opentelemetry_and_otel_without_the_extra_is_one_line(without_the_extra, tmp_path):
    env, marker = without_the_extra
    script = scripts(tmp_path, quick=[{"sh": "echo ok >&4"}, {"exit": "success"}])
    argv = ("-q", "-m", f"script:{script / 'quick.yaml'}", "say ok")
    plain = qb("run", *argv, env=plain_env(**env))
    assert (plain.returncode, plain.stdout, marker.exists()) == (0, b"ok\n", False), plain.stderr
    index = Index()
    before = len(index.recent(10_000))
    refused = qb("run", "--otel", *argv, env=plain_env(**env))
    assert (refused.returncode, refused.stdout) == (2, b"")
    assert refused.stderr.decode() == "quinebox: --otel needs the OpenTelemetry extra: pip install 'quinebox[otel]'\n"
    assert len(index.recent(10_000)) == before  # nothing started
    index.close()
    warned = qb("run", *argv, env=plain_env(**env, OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9"))
    assert (warned.returncode, warned.stdout) == (0, b"ok\n")
    assert "OTEL_EXPORTER_OTLP_ENDPOINT is set, but quinebox's traces need the OpenTelemetry extra (pip install 'quinebox[otel]')" in warned.stderr.decode()
    assert qb("trace", "anything", env=plain_env(**env)).returncode == 2

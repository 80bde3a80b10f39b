"""An OpenAI-compatible chat-completions server of our own, on loopback, for tests and benchmarks.

It answers from a script of steps, one per request: a tool call, a plain
reply, or an HTTP error (each after `delay` seconds, or its own `"delay"`).
When the script runs out, the last step repeats.
Every request is kept, headers and body, so tests can see what the real
openai client sent.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def tool(name: str, args: dict[str, Any] | str, *, usage: tuple[int, int] = (10, 5)) -> dict[str, Any]:
    arguments = args if isinstance(args, str) else json.dumps(args)
    return {"tool_calls": [{"id": f"call_{name}", "type": "function", "function": {"name": name, "arguments": arguments}}], "usage": usage}


def sh(command: str, **kw: Any) -> dict[str, Any]:
    return tool("sh", {"command": command}, **kw)


def exit_(status: str = "success", reason: str = "") -> dict[str, Any]:
    return tool("exit", {"status": status, "reason": reason})


def text(content: str) -> dict[str, Any]:
    return {"content": content, "usage": (10, 5)}


def error(status: int, message: str = "error", code: str | None = None, retry_after_ms: int | None = None) -> dict[str, Any]:
    return {"status": status, "message": message, "code": code, "retry_after_ms": retry_after_ms}


@dataclass
class Seen:
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class FakeOpenAI:
    steps: list[dict[str, Any]] = field(default_factory=list)
    requests: list[Seen] = field(default_factory=list)
    #: Seconds each answer takes, so overlapping calls can be seen.
    delay: float = 0.0
    in_flight: int = 0
    max_in_flight: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out as two writes

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                with fake._lock:
                    fake.requests.append(Seen({k.lower(): v for k, v in self.headers.items()}, body))
                    index = min(len(fake.requests) - 1, len(fake.steps) - 1)
                    step = fake.steps[index] if fake.steps else text("no script")
                    fake.in_flight += 1
                    fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
                time.sleep(step.get("delay", fake.delay))  # a step may take its own time: a model call in flight, held
                with fake._lock:
                    fake.in_flight -= 1
                self._answer(step, body)

            def _answer(self, step: dict[str, Any], body: dict[str, Any]) -> None:
                if "status" in step:
                    payload = {"error": {"message": step["message"], "type": "invalid_request_error", "code": step["code"]}}
                    self._send(step["status"], payload, retry_after_ms=step.get("retry_after_ms"))
                    return
                prompt, completion = step.get("usage", (10, 5))
                message = {"role": "assistant", "content": step.get("content")}
                if step.get("tool_calls"):
                    message["tool_calls"] = step["tool_calls"]
                self._send(200, {
                    "id": "chatcmpl-test",
                    "object": "chat.completion",
                    "created": 0,
                    "model": body.get("model", "test"),
                    "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if step.get("tool_calls") else "stop"}],
                    "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
                })

            def _send(self, status: int, payload: dict[str, Any], retry_after_ms: int | None = None) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if retry_after_ms is not None:
                    self.send_header("retry-after-ms", str(retry_after_ms))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

"""The MCP server (`quinebox mcp`): quinebox's long-lived boxes as tools for any MCP client, over stdio or HTTP.

A client (Claude Code, Codex, any agent speaking the Model Context Protocol) makes boxes, runs commands and
reads, writes and edits files in them, looks at and rolls back their worlds, and runs quinebox agents. The
server's grants (-g, --policy) are the ceiling: every box it makes holds at most those (grants.attenuate,
as a box's child does), and a request for more is refused in one line and recorded in the audit log as
`child_refused`. The boxes are the server's: they end with it (its death included), and a client reaches
only the boxes this server made and the sessions it ran.

Nothing a client sends is trusted: every argument is checked and capped, each tool's failure is one line
for that call (never the server's end), and the file tools stay within the box's /world and the paths it
was granted, resolved inside the box (a link out of them is refused). Only this module imports `mcp`:
here are the server class, the SDK's server with every tool's failure one line and unknown arguments refused,
and the transports (stdio; HTTP on loopback behind a bearer token). The tools are mcp_tools' (boxes, commands,
files), mcp_worlds' (revisions), mcp_missions' (agents) and mcp_snapshots' (pause, snapshots, forks), over
mcp_boxes' shared state; mcp_checks checks
every argument and narrows every grant.
"""

from __future__ import annotations

import functools
import hmac
import json
import os
import secrets
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp.types import CallToolResult, TextContent
from pydantic import ConfigDict, ValidationError

from quinebox.errors import QuineboxError
from quinebox.integrations.mcp_checks import MAX_BOXES, Refused, one_line
from quinebox.integrations.mcp_missions import MissionTools
from quinebox.integrations.mcp_snapshots import SnapshotTools
from quinebox.integrations.mcp_tools import BoxTools
from quinebox.integrations.mcp_worlds import WorldTools


class QuineboxMCP(BoxTools, WorldTools, MissionTools, SnapshotTools):
    """The server: its state and tools (Boxes and the tool classes), and `mcp`, the MCP server that serves them."""

    def __init__(
        self,
        grants: list[str] | tuple[str, ...] = (),
        *,
        policy: str | None = None,
        image: str | None = None,
        backend: str | None = None,
        runtime: str | None = None,
        model: str | None = None,
        max_boxes: int = MAX_BOXES,
        cwd: str | None = None,
    ):
        super().__init__(grants, policy=policy, image=image, backend=backend, runtime=runtime, model=model, max_boxes=max_boxes, cwd=cwd)
        self.mcp = Server("quinebox", instructions=INSTRUCTIONS, log_level="WARNING", tools=[strict(fn, name) for name, fn in self.tools().items()])

    def tools(self) -> dict[str, Callable[..., Any]]:
        return {
            "create_sandbox": self.create_sandbox, "list_sandboxes": self.list_sandboxes, "remove_sandbox": self.remove_sandbox,
            "exec": self.exec, "read_file": self.read_file, "write_file": self.write_file, "edit_file": self.edit_file,
            "list_files": self.list_files, "world_log": self.world_log, "world_diff": self.world_diff,
            "restore_revision": self.restore_revision, "export_world": self.export_world,
            "run_mission": self.run_mission, "fork_session": self.fork_session,
            "pause_sandbox": self.pause_sandbox, "resume_sandbox": self.resume_sandbox, "checkpoint_sandbox": self.checkpoint_sandbox,
            "restore_sandbox": self.restore_sandbox, "fork_sandbox": self.fork_sandbox, "list_snapshots": self.list_snapshots,
            "remove_snapshot": self.remove_snapshot,
        }

    # -- transports -----------------------------------------------------------------------------

    def serve_stdio(self) -> None:
        import signal

        import anyio

        def stop(signum: int, _frame: object) -> None:
            # Not an exception in the loop: its end would wait for the thread blocked reading stdin, and for every
            # call still running. The boxes go first (which ends those calls), then the process, 128+n.
            def end() -> None:
                try:
                    self.close()
                finally:
                    os._exit(128 + signum)

            threading.Thread(target=end, daemon=True).start()

        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, stop)
        try:
            anyio.run(self.mcp.run_stdio_async)
        finally:
            self.close()

    def serve_http(self, *, port: int = 0, token: str | None = None, announce: Callable[[str], None] | None = None) -> None:
        """Streamable HTTP on 127.0.0.1 only, every request with `Authorization: Bearer TOKEN` (else 401)."""
        import socket

        import uvicorn

        given = token is not None
        token = token or secrets.token_urlsafe(32)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(128)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
        (announce or (lambda line: print(f"quinebox: {line}", file=sys.stderr, flush=True)))(
            f"serving MCP on {url} with the header 'Authorization: Bearer {'<the token given>' if given else token}' (Ctrl-C stops)"
        )
        app = Bearer(self.mcp.streamable_http_app(host="127.0.0.1"), token)
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5))
        try:
            server.run(sockets=[sock])
        finally:
            self.close()


class Server(MCPServer):
    """The SDK's server, its argument errors one line like every other tool error (the SDK's span many)."""

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            if not isinstance(exc.__cause__, ValidationError):
                raise
            wrong = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.__cause__.errors()[:10])
            return failed(f"bad arguments for {name}: {wrong}")


class Bearer:
    """ASGI: HTTP requests without the server's bearer token get 401; everything else goes on to `app`."""

    def __init__(self, app: Any, token: str):
        self.app, self.expected = app, f"Bearer {token}".encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            given = next((v for k, v in scope.get("headers", []) if k == b"authorization"), b"")
            if not hmac.compare_digest(given, self.expected):
                body = b'{"error": "unauthorized: send the header Authorization: Bearer TOKEN that quinebox mcp printed"}'
                headers = [(b"content-type", b"application/json"), (b"www-authenticate", b'Bearer realm="quinebox"'), (b"content-length", str(len(body)).encode())]
                await send({"type": "http.response.start", "status": 401, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A tool whose every failure is one line for this call: the client's mistake, a refusal, or quinebox's error."""

    @functools.wraps(fn)
    async def tool(**kwargs: Any) -> CallToolResult:
        import anyio

        # In a worker thread, abandoned when the call is cancelled or the server stops: a long exec holds neither up
        # (the server's end removes the box, which ends the exec).
        return await anyio.to_thread.run_sync(functools.partial(called, **kwargs), abandon_on_cancel=True)

    def called(**kwargs: Any) -> CallToolResult:
        try:
            result = fn(**kwargs)
        except (Refused, QuineboxError) as exc:
            return failed(str(exc))
        except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
            return failed(f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # noqa: BLE001 - a tool's crash is that call's, never the server's
            traceback.print_exc(file=sys.stderr)
            return failed(f"internal error ({type(exc).__name__}): {exc}")
        return CallToolResult(content=[TextContent(type="text", text=json.dumps(result, indent=1, ensure_ascii=False))], structured_content=result)

    return tool


def failed(message: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=one_line(message))], is_error=True)


def strict(fn: Callable[..., Any], name: str) -> Tool:
    """The tool, its arguments checked with unknown ones refused (the SDK would drop them silently)."""
    tool = Tool.from_function(guarded(fn), name=name, structured_output=False)
    base = tool.fn_metadata.arg_model

    class Arguments(base):  # type: ignore[misc, valid-type]  # a base known only at run time (the SDK's model of fn's arguments)
        model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    Arguments.__name__ = base.__name__
    tool.fn_metadata.arg_model = Arguments
    tool.parameters["additionalProperties"] = False
    return tool


INSTRUCTIONS = """quinebox: hardened boxes for running commands and agents. create_sandbox makes a box (its id is used
by every other tool); exec runs a command in it; read_file / write_file / edit_file / list_files work on its /world
(and paths it was granted); world_log / world_diff / restore_revision / export_world show and roll back what changed;
pause_sandbox / resume_sandbox stop and go on, checkpoint_sandbox / restore_sandbox / fork_sandbox copy a live box (gVisor).
Every box holds at most this server's grants. Each result says what a person can run to look (`look`)."""

"""The view's web server: a Starlette app of JSON routes, one event stream, and the page's static files.

Protected as Jupyter protects a notebook: a random token in the URL the command prints; the first page
load sets it as a cookie, the page sends it with every call, and anything without it gets 403. Changing
anything (approving a request) also needs the token in a header, which another site's form cannot send.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import math
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from quinebox.audit import approvals
from quinebox.errors import QuineboxError
from quinebox.view.catalog import Catalog

STATIC = Path(__file__).parent / "static"
COOKIE = "quinebox_view_token"
#: How often an event stream looks for changes, and how often it says it is still there.
POLL_S = 0.25
PING_S = 15.0
#: The page may load only what this server serves.
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; "
        "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
FORBIDDEN = "403: this view needs its token: open the URL `quinebox view` printed (it ends in ?token=…)\n"


@dataclass(frozen=True)
class Settings:
    token: str
    allow_approve: bool = False
    #: The port, in the cookie's name: a browser sends a host's cookies to every port of it, so two views side by
    #: side would each overwrite the other's token.
    port: int = 0

    @property
    def cookie(self) -> str:
        return f"{COOKIE}_{self.port}"


def _authorized(request: Request, settings: Settings) -> bool:
    token = settings.token
    given = request.query_params.get("token") or request.cookies.get(settings.cookie) or ""
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        given = header[7:].strip()
    return bool(given) and hmac.compare_digest(given.encode(), token.encode())


def make_app(settings: Settings, catalog: Catalog | None = None) -> Starlette:
    catalog = catalog or Catalog()

    def reply(value: Any, status: int = 200) -> Response:
        catalog.learn_secrets()  # a box granted a secret since the last answer: its value is scrubbed from this one on
        return Response(catalog.redactor.json(value), status_code=status, media_type="application/json", headers=HEADERS)

    def route(path: str, read: Callable[[Request], Any]) -> Route:
        """A GET answered by `read(request)` in a thread (it reads files and SQLite), as JSON."""
        async def endpoint(request: Request) -> Response:
            try:
                return reply(await run_in_threadpool(read, request))
            except KeyError as exc:
                return reply({"error": f"not found: {exc.args[0] if exc.args else ''}"}, 404)
            except QuineboxError as exc:
                return reply({"error": str(exc)}, 404)
            except ValueError as exc:
                return reply({"error": str(exc)}, 400)

        return Route(path, endpoint)

    def number(request: Request, name: str, default: float | None = None) -> float | None:
        value = request.query_params.get(name)
        if value in (None, ""):
            return default
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not math.isfinite(number):
            raise ValueError(f"{name} must be a number, not {value!r}")
        return number

    def sessions(request: Request) -> Any:
        exit_code = number(request, "exit")
        return {"sessions": catalog.sessions.list(
            q=request.query_params.get("q", ""), state=request.query_params.get("state", ""), since=number(request, "since"),
            exit_code=None if exit_code is None else int(exit_code), limit=int(number(request, "limit", 200) or 200),
        )}

    def world_rev(request: Request) -> tuple[str, int]:
        return catalog.sessions.find(request.path_params["id"]).id, int(request.path_params["rev"])

    async def approve(request: Request) -> Response:
        if not settings.allow_approve:
            return PlainTextResponse("403: this view is read-only; start it with `quinebox view --allow-approve` to decide requests\n", 403, headers=HEADERS)
        if not hmac.compare_digest(request.headers.get("x-quinebox-token", "").encode(), settings.token.encode()):
            return PlainTextResponse("403: a decision needs the X-Quinebox-Token header\n", 403, headers=HEADERS)
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("allow"), bool) or body.get("scope", "once") not in approvals.SCOPES:
            return reply({"error": 'send {"allow": true|false, "scope": "once"|"session"|"always"}'}, 400)
        try:
            entry = await run_in_threadpool(approvals.decide, request.path_params["id"], allow=body["allow"], scope=body.get("scope", "once"), by="view")
        except QuineboxError as exc:
            return reply({"error": str(exc)}, 404)
        return reply({"decided": entry["id"]})

    async def events(request: Request) -> Response:
        topics = [t for t in request.query_params.get("topics", "sessions").split(",") if t][:32]

        async def stream():
            seen = await run_in_threadpool(catalog.stamps, topics)
            # "ready": from here on every change is told; the page reads once more whatever changed before it.
            yield "retry: 1000\nevent: ready\ndata: {}\n\n"
            last = time.monotonic()
            while not await request.is_disconnected():
                await asyncio.sleep(POLL_S)
                now = await run_in_threadpool(catalog.stamps, topics)
                for topic in topics:
                    if now.get(topic) != seen.get(topic):
                        yield f"event: change\ndata: {catalog.redactor.json({'topic': topic})}\n\n"
                seen = now
                if time.monotonic() - last > PING_S:
                    last = time.monotonic()
                    yield ": ping\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream", headers={**HEADERS, "X-Accel-Buffering": "no"})

    async def page(request: Request) -> Response:
        response = FileResponse(STATIC / "index.html", headers=HEADERS)
        if request.query_params.get("token"):
            response.set_cookie(settings.cookie, settings.token, httponly=True, samesite="strict")
        return response

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        path = (STATIC / name).resolve()
        if path.parent != STATIC.resolve() or not path.is_file():
            return PlainTextResponse("404: no such file\n", 404, headers=HEADERS)
        return FileResponse(path, headers=HEADERS)

    routes = [
        Route("/", page),
        Route("/static/{name}", static),
        route("/api/sessions", sessions),
        route("/api/sessions/{id}", lambda r: catalog.sessions.one(r.path_params["id"])),
        route("/api/sessions/{id}/tree", lambda r: catalog.sessions.tree(r.path_params["id"])),
        route("/api/sessions/{id}/transcript", lambda r: catalog.sessions.transcript(r.path_params["id"], int(number(r, "after", 0) or 0))),
        route("/api/sessions/{id}/world", lambda r: catalog.world_revisions(catalog.sessions.find(r.path_params["id"]).id)),
        route("/api/sessions/{id}/world/{rev:int}/diff", lambda r: catalog.world_diff(*world_rev(r))),
        route("/api/sessions/{id}/world/{rev:int}/files", lambda r: catalog.world_files(*world_rev(r))),
        route("/api/sessions/{id}/world/{rev:int}/file", lambda r: catalog.world_file(*world_rev(r), r.query_params.get("path", ""))),
        route("/api/runs", lambda r: {"runs": catalog.runs()}),
        route("/api/runs/{id}", lambda r: {"run": catalog.run(r.path_params["id"])}),
        route("/api/audit", lambda r: catalog.audit.page(int(number(r, "limit", 200) or 200))),
        route("/api/approvals", lambda r: {"pending": catalog.pending(), "allow_approve": settings.allow_approve}),
        Route("/api/approvals/{id}", approve, methods=["POST"]),
        Route("/api/events", events),
    ]
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        catalog.close()

    return Starlette(routes=routes, middleware=[Middleware(TokenGuard, settings=settings)], lifespan=lifespan)


class TokenGuard:
    """Every request, the page and its files included, answers 403 without the token."""

    def __init__(self, app: ASGIApp, settings: Settings):
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not _authorized(Request(scope), self.settings):
            await PlainTextResponse(FORBIDDEN, 403, headers=HEADERS)(scope, receive, send)
            return
        await self.app(scope, receive, send)

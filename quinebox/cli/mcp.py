"""`quinebox mcp`: an MCP server whose tools make and use hardened boxes, on stdio or (--http) on loopback."""

from __future__ import annotations

import os

import typer

from quinebox.cli.app import BACKEND_HELP, RUNTIME_HELP, app, backend_metavar, check_backend, reported, say

TOKEN_ENV = "QUINEBOX_MCP_TOKEN"


@app.command(
    "mcp",
    help="Serve MCP (stdio; --http: streamable HTTP on 127.0.0.1 with a bearer token): tools to make boxes, run commands and "
    "agents in them, read, write and edit their files, and see and roll back their worlds. -g/--policy are the most any box may hold.",
)
def mcp_command(
    grant: list[str] = typer.Option([], "-g", "--grant", metavar="SPEC", help="A grant every box may be given at most (repeat): rw:PATH, ro:PATH, net:HOST, mem:SIZE, ..."),
    policy: str | None = typer.Option(None, "--policy", metavar="FILE.yaml|PRESET", help="Grants (and deny rules) from a policy file or preset: the ceiling too."),
    image: str | None = typer.Option(None, "--image", help="The image of boxes a client does not choose one for (default: the agent image)."),
    model: str | None = typer.Option(None, "--model", "-m", help="The model of run_mission and fork_session (default: QUINEBOX_MODEL or config.yaml)."),
    max_boxes: int = typer.Option(8, "--max-boxes", min=1, help="How many boxes the server holds at once."),
    http: bool = typer.Option(False, "--http", help="Serve streamable HTTP on 127.0.0.1 instead of stdio."),
    port: int = typer.Option(0, "--port", min=0, max=65535, help="With --http: the port (default: a free one, printed)."),
    token_file: str | None = typer.Option(
        None, "--token-file", metavar="FILE", help=f"With --http: the bearer token, from this file (else ${TOKEN_ENV}, else a random one, printed).",
    ),
    backend: str | None = typer.Option(None, "--backend", metavar=backend_metavar(), help=BACKEND_HELP),
    runtime: str | None = typer.Option(None, "--runtime", metavar="runc|crun|runsc|PATH", help=RUNTIME_HELP),
) -> None:
    check_backend(backend)  # backend and runtime reach the server's boxes in its options (QuineboxMCP's), below
    token = None
    if token_file:
        try:
            with open(token_file) as handle:
                token = handle.read().strip()
        except OSError as exc:
            say(f"cannot read --token-file {token_file}: {exc.strerror}")
            raise typer.Exit(2) from None
    token = token or os.environ.get(TOKEN_ENV) or None
    if token is not None and len(token) < 16:
        say("the bearer token is shorter than 16 characters; make one with `head -c 32 /dev/urandom | base64`")
        raise typer.Exit(2)
    try:
        from quinebox.integrations.mcp_server import QuineboxMCP
    except ImportError as exc:
        say(f"the MCP server needs the mcp package ({exc.name} is missing): pip install 'quinebox[mcp]'")
        raise typer.Exit(125) from None
    with reported():
        server = QuineboxMCP(grant, policy=policy, image=image, backend=backend, runtime=runtime, model=model, max_boxes=max_boxes)
    try:
        if http:
            server.serve_http(port=port, token=token, announce=say)
        else:
            server.serve_stdio()
    except KeyboardInterrupt:
        pass

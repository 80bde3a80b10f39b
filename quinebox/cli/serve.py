"""`quinebox serve`: the per-user command server (in the foreground, or --background), `serve status`, `serve stop`."""

from __future__ import annotations

import os
import sys
import time

import typer

from quinebox.cli.app import app, reported, say

serve_app = typer.Typer(help="A per-user command server: exec, run, map, batch and shell start without the CLI's start-up.")
app.add_typer(serve_app, name="serve")


@serve_app.callback(invoke_without_command=True)
def serve(
    ctx: typer.Context,
    background: bool = typer.Option(False, "--background", help="Detach, log to the state dir's serve.log, and return once it answers."),
) -> None:
    if ctx.invoked_subcommand:
        return
    from quinebox.cli.server import Server, status, warm
    from quinebox.state import state_dir

    server = Server()
    with reported():
        server.bind()
    warm()
    if background:
        if os.fork():
            server.listener.close()  # type: ignore[union-attr]  # the child holds it now
            for _ in range(100):
                if status() is not None:
                    say(f"serving on {server.path}")
                    raise typer.Exit(0)
                time.sleep(0.05)
            say("the server did not answer; see serve.log in the state dir")
            raise typer.Exit(125)
        os.setsid()
        log = os.open(state_dir() / "serve.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
    else:
        say(f"serving on {server.path} (Ctrl-C stops)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    sys.exit(0)


@serve_app.command("status", help="Exit 0 when a server answers (and say since when and how much it served), 1 when none does.")
def status_command() -> None:
    from quinebox.cli.server import status

    answer = status()
    if answer is None:
        say("no command server answers: `quinebox serve --background` starts one")
        raise typer.Exit(1)
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(answer.get("since", 0)))
    print(f"serving: pid {answer.get('pid')}, since {since}, {answer.get('served')} command(s) served")


@serve_app.command("stop", help="Stop the server; commands it is running go on to their end.")
def stop_command() -> None:
    from quinebox.cli.server import stop

    if not stop():
        say("no command server answers")
        raise typer.Exit(1)
    say("stopped")

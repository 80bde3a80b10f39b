"""The `quinebox` command: a typer app, one module per command group, each a thin layer over the library.

    app.py      the app itself, and what every command shares (errors, signals, exit status)
    box.py      exec, ps, kill, gc, doctor, image build
    agents.py   run, fork, ls, show, logs, replay, tree, trace
    fanout.py   map, batch
    worlds.py   world log, diff, export, adopt, commit
    audit.py    audit, audit verify, approvals, approve, deny, revoke
    serve.py    serve, serve status, serve stop
    sandboxes.py  box create, box ls, box rm, cp (long-lived boxes; `exec --in` is box.py's)
    snapshots.py  box pause, resume, checkpoint, restore, fork, snapshots (a long-lived box's time)
    mcp.py      mcp: the MCP server (quinebox[mcp])
    view.py     view: the web view of sessions, trees, transcripts, worlds, runs and the audit log (quinebox[view])
    server.py   the command server: a warm process handing each command to a worker it forked (its thin client is ../client.py)
    workers.py  a worker's life: a client's command run as the CLI runs it, then the next while each leaves it clean
    freshness.py  whether a command server still runs the code and config a fresh `quinebox` would

The CLI may import every layer below it; nothing below imports it. Each module registers its commands on the
app when imported; `register` imports only the one that a command line names, because typer builds every
registered command into click's at each start-up: with their imports, most of the CLI's own start-up.
"""

from __future__ import annotations

import importlib
import sys

from quinebox.cli.app import app

__all__ = ["COMMANDS", "app", "main", "register"]

#: Each top-level command or group, and the module that registers it (a group's commands, for a group).
COMMANDS = {
    **dict.fromkeys(("exec", "shell", "enter", "ps", "kill", "gc", "doctor", "setup-user", "image"), "box"),
    **dict.fromkeys(("run", "fork", "resume", "ls", "show", "logs", "replay", "tree", "trace", "prune"), "agents"),
    **dict.fromkeys(("map", "batch"), "fanout"),
    "world": "worlds",
    **dict.fromkeys(("audit", "approvals", "approve", "deny", "revoke"), "audit"),
    "serve": "serve",
    "box": "snapshots",  # which registers sandboxes.py's too
    "cp": "sandboxes",
    "mcp": "mcp",
    "view": "view",
}


def register(argv: list[str] | None = None) -> None:
    """Register the command `argv` names (its first word), or every command when it names none of them: for
    `--help`, `--version`, a mistyped name, or a command server, which serves them all."""
    modules = [COMMANDS[argv[0]]] if argv and argv[0] in COMMANDS else sorted(set(COMMANDS.values()))
    for module in modules:
        importlib.import_module(f"quinebox.cli.{module}")


def ensure_std_fds() -> None:
    """Give closed stdin/stdout/stderr /dev/null, before anything else can be opened as fd 0-2.

    Otherwise the first socket we open becomes "stdin" and we would pump our
    own engine connection into the box.
    """
    import os

    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDWR)


def main() -> None:
    ensure_std_fds()
    from quinebox.cli.app import run_app

    register([word for word in sys.argv[1:] if word != "--traceback"][:1])
    run_app()

"""The `quinebox` command: a typer app, one module per command group, each a thin layer over the library.

    app.py      the app itself, and what every command shares (errors, signals, exit status)
    box.py      exec, ps, kill, gc, doctor, image build
    agents.py   run, fork, ls, show, logs, replay, tree
    fanout.py   map, batch
    worlds.py   world log, diff, export, adopt, commit
    audit.py    audit, audit verify, approvals, approve, deny, revoke
    serve.py    serve, serve status, serve stop
    server.py   the command server: a warm process forking one worker per command (its thin client is ../client.py)

The CLI may import every layer below it; nothing below imports it.
"""

from __future__ import annotations

from quinebox.cli import agents, audit, box, fanout, serve, worlds  # noqa: F401  (each registers its commands on the app)
from quinebox.cli.app import app

__all__ = ["app", "main"]


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

    run_app()

"""The `quinebox` command: a typer app, one module per command group, each a thin layer over the library.

    app.py      the app itself, and what every command shares (errors, signals, exit status)
    box.py      exec, ps, kill, gc, doctor, image build
    agents.py   run, fork, ls, show, logs, replay, tree
    fanout.py   map, batch
    worlds.py   world log, diff, export, adopt, commit
    audit.py    audit, audit verify, approvals, approve, deny, revoke

The CLI may import every layer below it; nothing below imports it.
"""

from __future__ import annotations

from quinebox.cli import agents, audit, box, fanout, worlds  # noqa: F401  (each registers its commands on the app)
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
    import errno

    ensure_std_fds()
    from quinebox.cli.app import say
    from quinebox.errors import EXIT_QUINEBOX, QuineboxError

    try:
        app()
    except QuineboxError as exc:  # a command that did not say it itself
        say(str(exc))
        raise SystemExit(exc.exit_code) from None
    except OSError as exc:  # a full or read-only filesystem under us: one line, as for quinebox's own errors
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
            raise
        from quinebox.state import state_dir

        where = f" {exc.filename}" if exc.filename else ""
        say(f"cannot write{where}: {exc.strerror}; free some space (the state dir is {state_dir()}) and run again")
        raise SystemExit(EXIT_QUINEBOX) from None

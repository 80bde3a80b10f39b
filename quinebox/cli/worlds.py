"""Commands for a session's world: `world log`, `diff`, `export`, `adopt`, `commit`."""

from __future__ import annotations

import sys

import typer

from quinebox.cli.app import reported, say, world_app


@world_app.command("log", help="A world's revisions: the turn and command that made each, paths changed, bytes.")
def world_log_command(session: str) -> None:
    from quinebox.worlds import history

    with reported():
        history.print_log(history.resolve(session))


@world_app.command("diff", help="What revision REV (default: the newest) changed since --against (default: the one before it).")
def world_diff_command(
    session: str,
    rev: int | None = typer.Argument(None, min=0),
    against: int | None = typer.Option(None, "--against", min=0, metavar="REV"),
) -> None:
    from quinebox.worlds import history

    with reported():
        history.print_diff(history.resolve(session), rev, against)


@world_app.command("export", help="Write a revision of a world (default: the newest) as a tar archive to stdout.")
def world_export_command(session: str, rev: int | None = typer.Argument(None, min=0)) -> None:
    import os

    from quinebox.worlds import history

    if os.isatty(1):
        say("stdout is a terminal: redirect it, as in `quinebox world export ID > world.tar`")
        raise typer.Exit(2)
    with reported():
        skipped = history.export(history.resolve(session), rev, sys.stdout.buffer)
    if skipped:
        say(f"left out {len(skipped)} entr{'y' if len(skipped) == 1 else 'ies'}: {'; '.join(skipped[:10])}")


@world_app.command("adopt", help="Merge what CHILD changed in its inherited world into its parent's world.")
def world_adopt_command(
    child: str,
    force: bool = typer.Option(False, "--force", help="On a conflict (the parent changed the same path), take the child's version."),
) -> None:
    from quinebox.box.owners import listing
    from quinebox.worlds import adopt, build, history

    with reported():
        session = history.resolve(child)
        spec, _ = build.load_spec(session)
        running = spec.base is not None and listing.is_running(spec.base[0])
        parent, adopted, missing = adopt.adopt(session, force=force, parent_running=running)
    for code, path in adopted:
        print(f"{code} {path}")
    say(f"adopted {len(adopted)} change(s) from {session} into {parent}'s world")
    if missing:
        say(f"could not adopt {len(missing)}, left as they were: {'; '.join(missing[:10])}")


@world_app.command("commit", help="Take a revision of an ended session's world now (an agent's world gets one after each sh call).")
def world_commit_command(session: str) -> None:
    from quinebox.box.owners import listing
    from quinebox.worlds import history
    from quinebox.worlds.world import World

    with reported():
        session = history.resolve(session)
        if listing.is_running(session):
            say(f"{session} is still running: its world is revised after each sh call; commit once it ends")
            raise typer.Exit(2)
        world = World.offline(session)
        try:
            record = world.revise("commit")
        finally:
            world.close()
    print(f"revision {record['rev']}: {record['files']} path(s) changed" if record else "no change since the newest revision")

"""Commands for a long-lived box's time: `box pause`, `resume`, `checkpoint`, `restore`, `fork` and `snapshots`.

A box's owner (its holder, or the Python process of its Sandbox) runs its clocks and waits for its init, so these
ask it (box/live/controls.py); a copy of a snapshot's box gets a holder of its own, as a `box create` box does
(sandboxes.py's `holding`).
"""

from __future__ import annotations

import json
import time
from typing import Any

import typer

from quinebox.cli.app import reported, say
from quinebox.cli.sandboxes import DEFAULT_IDLE, box_app, holding, told

snapshots_app = typer.Typer(help="Snapshots of long-lived boxes (`quinebox box checkpoint ID` makes one): list them, or `rm` them.")
box_app.add_typer(snapshots_app, name="snapshots")


def _ask(ref: str, op: str, **args: Any) -> dict[str, Any]:
    from quinebox.box.live import controls, sandboxes

    record, _ = sandboxes.find(ref)
    return controls.ask(record.session, {"op": op, **args})


@box_app.command("pause", help="Stop every process of long-lived boxes where they are; their TTL and idle clocks stand still.")
def box_pause_command(refs: list[str] = typer.Argument(..., metavar="ID|NAME...")) -> None:
    for ref in refs:
        with reported():
            print(_ask(ref, "pause")["box"])


@box_app.command("resume", help="Let every process of paused boxes go on, and their clocks with them.")
def box_resume_command(refs: list[str] = typer.Argument(..., metavar="ID|NAME...")) -> None:
    for ref in refs:
        with reported():
            print(_ask(ref, "resume")["box"])


@box_app.command("checkpoint", help="Snapshot a long-lived box on gVisor (memory, processes, open files, tmpfs, /world); print the snapshot's id. The box goes on.")
def box_checkpoint_command(ref: str = typer.Argument(..., metavar="ID|NAME")) -> None:
    with reported():
        print(_ask(ref, "checkpoint")["snapshot"])


def _idle(idle: str) -> float | None:
    from quinebox.grants import parse_duration

    return parse_duration(idle) if idle not in ("0", "") else None


@box_app.command("restore", help="Make a new live box from a snapshot (a new id, printed); its processes go on from the snapshot's instant.")
def box_restore_command(
    snapshot: str = typer.Argument(..., metavar="SNAPSHOT"),
    name: str | None = typer.Option(None, "--name", help="A name `exec --in`, `cp` and `box rm` take instead of the id."),
    ttl: str | None = typer.Option(None, "--ttl", metavar="DURATION", help="Remove the box this long after it is made (30m, 2h)."),
    idle: str = typer.Option(DEFAULT_IDLE, "--idle", metavar="DURATION", help="Remove it after this long with no command run in it (0: never)."),
) -> None:
    from quinebox.box.live import snapshots

    with reported():
        made = snapshots.find(snapshot)
        snapshots.verify(made)  # here, before any holder: a refused snapshot leaves nothing behind
        idle_s = _idle(idle)
    raise typer.Exit(told(*holding({"snapshot": made.id, "checked": True, "ttl": ttl, "name": name}, idle_s)))


@box_app.command("fork", help="Make N live copies of a long-lived box from one instant, each with its own world; print their ids, one a line. The box goes on.")
def box_fork_command(
    ref: str = typer.Argument(..., metavar="ID|NAME"),
    n: int = typer.Option(1, "-n", "--copies", min=1, max=64, help="How many copies."),
    ttl: str | None = typer.Option(None, "--ttl", metavar="DURATION", help="Remove each copy this long after it is made."),
    idle: str = typer.Option(DEFAULT_IDLE, "--idle", metavar="DURATION", help="Remove each after this long with no command run in it (0: never)."),
) -> None:
    from quinebox.box.live import snapshots

    with reported():
        idle_s = _idle(idle)
        made = _ask(ref, "checkpoint", transient=True)["snapshot"]
    try:
        holders = [holding({"snapshot": made, "checked": True, "ttl": ttl}, idle_s) for _ in range(n)]
        codes = [told(pid, read_end) for pid, read_end in holders]
    finally:
        with reported():
            snapshots.remove(snapshots.find(made))
    raise typer.Exit(max(codes))


@snapshots_app.callback(invoke_without_command=True)
def box_snapshots_command(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="One JSON object a line.")) -> None:
    from quinebox.box.live import snapshots
    from quinebox.sandbox import snapshot_facts

    if ctx.invoked_subcommand is not None:
        return
    with reported():
        found = snapshots.listing()
    if as_json:
        for snapshot in found:
            print(json.dumps(snapshot_facts(snapshot)))
        return
    print(f"{'SNAPSHOT':12}  {'BOX':12}  {'MADE':19}  {'SIZE':>8}  IMAGE")
    for snapshot in found:
        made = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(snapshot.created))
        print(f"{snapshot.id:12}  {snapshot.box:12}  {made:19}  {_size(snapshot.size):>8}  {snapshot.recipe.image}{' (a fork’s)' if snapshot.transient else ''}")


@snapshots_app.command("rm", help="Remove snapshots (yours only).")
def box_snapshots_rm_command(refs: list[str] = typer.Argument(..., metavar="SNAPSHOT...")) -> None:
    from quinebox.box.live import snapshots
    from quinebox.errors import QuineboxError

    code = 0
    for ref in refs:
        try:
            found = snapshots.find(ref)
            snapshots.remove(found)
        except QuineboxError as exc:
            say(str(exc))
            code = exc.exit_code
            continue
        print(found.id)
    raise typer.Exit(code)


def _size(count: int) -> str:
    from quinebox.grants import format_size

    return format_size(count)

"""Commands for boxes: `exec`, `ps`, `kill`, `gc`, `doctor`, `image build`."""

from __future__ import annotations

from typing import List, Optional

import typer

from quinebox.cli.app import WORLD_FROM_HELP, WORLD_HELP, WORLD_TAR_HELP, app, image_app, reported, say, supervise


@app.command(
    "exec",
    context_settings={"allow_interspersed_args": False},
    help="Run CMD as the main process of a fresh hardened box: stdin, stdout, stderr and the exit status pass through.",
)
def exec_command(
    cmd: List[str] = typer.Argument(..., metavar="-- CMD [ARGS...]", help="The command to run in the box."),
    grant: List[str] = typer.Option([], "-g", "--grant", metavar="SPEC", help="A grant: ro:PATH[=DEST], rw:…, net, cpus:N, mem:SIZE, pids:N, tmp:SIZE, time:DUR, env:NAME[=VALUE], syscall:NAME."),
    timeout: Optional[str] = typer.Option(None, "--timeout", metavar="DURATION", help="Wall-clock limit (30, 30s, 5m); exit 124 when reached."),
    memory: Optional[str] = typer.Option(None, "--memory", metavar="SIZE", help="Memory limit (128m, 2g); same as -g mem:SIZE."),
    cpus: Optional[str] = typer.Option(None, "--cpus", metavar="N", help="CPU limit; same as -g cpus:N."),
    pids: Optional[str] = typer.Option(None, "--pids", metavar="N", help="Process limit; same as -g pids:N."),
    image: Optional[str] = typer.Option(None, "--image", help="Image to run (built FROM the agent image)."),
    workdir: Optional[str] = typer.Option(None, "-w", "--workdir", help="Working directory inside the box."),
    env: List[str] = typer.Option([], "-e", "--env", metavar="NAME[=VALUE]", help="Pass one variable; same as -g env:…"),
    policy: Optional[str] = typer.Option(None, "--policy", metavar="FILE.yaml|PRESET", help="Grants from a policy file or preset (strict, dev)."),
    world: Optional[str] = typer.Option(None, "--world", metavar="DIR", help=WORLD_HELP),
    world_from: List[str] = typer.Option([], "--world-from", metavar="empty|PATH", help=WORLD_FROM_HELP),
    world_tar: Optional[str] = typer.Option(None, "--world-tar", metavar="FILE", help=WORLD_TAR_HELP),
    json_summary: bool = typer.Option(False, "--json", help="Print one JSON summary line on stderr at the end."),
) -> None:
    grants = list(grant)
    grants += [f"mem:{memory}"] if memory else []
    grants += [f"cpus:{cpus}"] if cpus else []
    grants += [f"pids:{pids}"] if pids else []
    grants += [f"env:{e}" for e in env]
    worlds = {"world": world, "world_from": world_from or None, "world_tar": world_tar}
    raise typer.Exit(run_box(cmd, grants=grants, timeout=timeout, image=image, workdir=workdir, policy=policy, json_summary=json_summary, **worlds))


def run_box(cmd: List[str], *, json_summary: bool, **options: object) -> int:
    from quinebox.api import Popen

    return supervise(lambda: Popen(cmd, **options), json_summary=json_summary)  # type: ignore[arg-type]


@app.command("ps", help="List live boxes: id, command, age, owner.")
def ps_command() -> None:
    from quinebox.box import labels

    with reported():
        rows = labels.live_boxes()
    labels.print_table(rows)


@app.command("kill", help="Kill a box and every box below it in its tree.")
def kill_command(session: str = typer.Argument(..., help="The box's session id (or a unique prefix).")) -> None:
    from quinebox.box import labels

    with reported():
        killed = labels.kill_subtree(session)
    if not killed:
        say(f"no live box {session!r} (or more than one starts so): `quinebox ps` lists them")
        raise typer.Exit(125)
    say(f"killed {len(killed)} box{'es' if len(killed) != 1 else ''}: {' '.join(killed)}")


@app.command("gc", help="Remove boxes whose owning quinebox process is gone.")
def gc_command() -> None:
    from quinebox.box import labels

    with reported():
        removed = labels.collect_garbage()
    say(f"removed {len(removed)} orphaned box{'es' if len(removed) != 1 else ''}" + (": " + " ".join(removed) if removed else ""))


@app.command("doctor", help="Check the engine, the image and kernel support, and say how to fix what is missing.")
def doctor_command() -> None:
    from quinebox.box import doctor

    raise typer.Exit(doctor.run())


@image_app.command("build", help="Build the agent image (bootstrapping the base offline when no registry is reachable).")
def image_build_command(
    base: Optional[str] = typer.Option(None, "--base", help="Base image to build on (default: debian:bookworm-slim, else a debootstrapped one)."),
) -> None:
    from quinebox.box.backends.docker import DockerBackend
    from quinebox.box.image import build_image

    with reported():
        build_image(DockerBackend.connect(), base=base)

"""Commands for boxes: `exec`, `shell`, `enter`, `ps`, `kill`, `gc`, `doctor`, `setup-user`, `image build`."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import typer

from quinebox.cli.app import (
    ASK_HELP,
    ASK_TIMEOUT_HELP,
    BACKEND_HELP,
    DENY_HELP,
    PULL_HELP,
    RUNTIME_HELP,
    TTY_HELP,
    WORLD_FROM_HELP,
    WORLD_HELP,
    WORLD_TAR_HELP,
    app,
    backend_metavar,
    follow_window,
    image_app,
    need_terminal,
    raw_terminal,
    reported,
    say,
    supervise,
)

if TYPE_CHECKING:
    from quinebox.box.options import BoxOptions


@app.command(
    "exec",
    context_settings={"allow_interspersed_args": False},
    help="Run CMD as the main process of a fresh hardened box: stdin, stdout, stderr and the exit status pass through.",
)
def exec_command(
    cmd: list[str] | None = typer.Argument(None, metavar="-- CMD [ARGS...]", help="The command to run in the box (default: the image's entrypoint and command)."),
    grant: list[str] = typer.Option(
        [], "-g", "--grant", metavar="SPEC",
        help="A grant: ro:PATH[=DEST], rw:…, net, cpus:N, mem:SIZE, pids:N, tmp:SIZE, time:DUR, env:NAME[=VALUE], syscall:NAME.",
    ),
    timeout: str | None = typer.Option(None, "--timeout", metavar="DURATION", help="Wall-clock limit (30, 30s, 5m); exit 124 when reached."),
    memory: str | None = typer.Option(None, "--memory", metavar="SIZE", help="Memory limit (128m, 2g); same as -g mem:SIZE."),
    cpus: str | None = typer.Option(None, "--cpus", metavar="N", help="CPU limit; same as -g cpus:N."),
    pids: str | None = typer.Option(None, "--pids", metavar="N", help="Process limit; same as -g pids:N."),
    image: str | None = typer.Option(
        None, "--image",
        help="Any image: its environment, workdir and default command are honoured; `host`: this machine's own root, read-only, its data hidden.",
    ),
    pull: str = typer.Option("missing", "--pull", metavar="missing|always|never", help=PULL_HELP),
    tty: bool = typer.Option(False, "-t", "--tty", help=TTY_HELP),
    interactive: bool = typer.Option(False, "-i", "--interactive", help="Accepted as docker takes it: stdin is always attached."),
    workdir: str | None = typer.Option(None, "-w", "--workdir", "--cwd", help="Working directory inside the box."),
    env: list[str] = typer.Option([], "-e", "--env", metavar="NAME[=VALUE]", help="Pass one variable; same as -g env:…"),
    policy: str | None = typer.Option(None, "--policy", metavar="FILE.yaml|PRESET", help="Grants from a policy file or preset (strict, dev, pypi, github)."),
    world: str | None = typer.Option(None, "--world", metavar="DIR", help=WORLD_HELP),
    world_from: list[str] = typer.Option([], "--world-from", metavar="empty|PATH", help=WORLD_FROM_HELP),
    world_tar: str | None = typer.Option(None, "--world-tar", metavar="FILE", help=WORLD_TAR_HELP),
    ask: list[str] = typer.Option([], "--ask", metavar="SPEC", help=ASK_HELP),
    deny: list[str] = typer.Option([], "--deny", metavar="SPEC", help=DENY_HELP),
    ask_timeout: str | None = typer.Option(None, "--ask-timeout", metavar="DURATION", help=ASK_TIMEOUT_HELP),
    json_summary: bool = typer.Option(False, "--json", help="Print one JSON summary line on stderr at the end."),
    backend: str | None = typer.Option(None, "--backend", metavar=backend_metavar(), help=BACKEND_HELP),
    runtime: str | None = typer.Option(None, "--runtime", metavar="runc|crun|runsc|PATH", help=RUNTIME_HELP),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Say where the box runs (which backend and runtime) and why."),
    inside: str | None = typer.Option(None, "--in", metavar="ID|NAME", help="Run CMD in this long-lived box (`quinebox box create`) instead of a fresh one."),
    user: str | None = typer.Option(
        None, "--user", metavar="UID[:GID]|NAME",
        help="With --in: run as this user of the box; root only where the box has a user namespace of its own (runc), never on the engine or gVisor.",
    ),
) -> None:
    if inside is not None:
        fixed = {"-g": grant, "--memory": memory, "--cpus": cpus, "--pids": pids, "--image": image, "--policy": policy, "--world": world,
                 "--world-from": world_from, "--world-tar": world_tar, "--ask": ask, "--deny": deny, "--backend": backend, "--runtime": runtime}
        given = [flag for flag, value in fixed.items() if value]
        if given:
            say(f"{', '.join(given)} cannot go with --in: a long-lived box's grants and image are fixed when it is made (`quinebox box create`)")
            raise typer.Exit(2)
        need_terminal(tty)
        raise typer.Exit(exec_in(inside, cmd or [], tty=tty, cwd=workdir, env=env, user=user, timeout=timeout))
    if user is not None:
        say("--user goes with --in: a fresh box runs as its own unprivileged user")
        raise typer.Exit(2)
    grants = list(grant)
    grants += [f"mem:{memory}"] if memory else []
    grants += [f"cpus:{cpus}"] if cpus else []
    grants += [f"pids:{pids}"] if pids else []
    grants += [f"env:{e}" for e in env]
    options = box_options(
        grants=grants, timeout=timeout, image=image, pull=pull, workdir=workdir, policy=policy, world=world, world_from=world_from,
        world_tar=world_tar, ask=ask, deny=deny, ask_timeout=ask_timeout, backend=backend, runtime=runtime,
    )
    need_terminal(tty)
    raise typer.Exit(run_box(cmd or [], options, json_summary=json_summary, tty=tty, verbose=verbose))


def box_options(**flags: Any) -> BoxOptions:
    """A command's box, from its flags: the one BoxOptions the layers below take (--backend and --runtime included:
    they reach the box through it, never through this process's environment). A --backend that names no backend
    is a usage error (exit 2), said before anything starts."""
    from quinebox.box.backends.registry import NAMES
    from quinebox.box.options import BoxOptions

    backend = flags.get("backend")
    if backend is not None and backend not in NAMES:
        say(f"bad --backend {backend!r}: use one of {', '.join(NAMES)}")
        raise typer.Exit(2)
    return BoxOptions(**flags)


def exec_in(ref: str, cmd: list[str], *, tty: bool, cwd: str | None, env: list[str], user: str | None, timeout: str | None) -> int:
    """CMD in a long-lived box, with this process's stdin, stdout and stderr. If this process dies first (SIGKILL
    included), what the command started goes with it; the box stays up either way."""
    import os
    import signal

    from quinebox.box.live import sandboxes
    from quinebox.box.live.execs import BoxExec
    from quinebox.box.live.freezing import refuse_if_paused
    from quinebox.box.live.owner_exec import exec_at_owner
    from quinebox.grants import parse_duration

    if not cmd:
        say("nothing to run: give a command, as in `quinebox exec --in ID -- sh`")
        return 2
    received: list[int] = []
    with reported():
        limit = parse_duration(timeout) if timeout else None
        record, _ = sandboxes.find(ref)
        refuse_if_paused(record.session)  # where execs start, for a paused box: one line
        variables = [e if "=" in e else f"{e}={os.environ.get(e, '')}" for e in env]
        handed = None if tty else exec_at_owner(record.session, cmd, cwd=cwd, env=variables, user=user, timeout=limit)
        if handed is not None:  # its owner runs it, started by the box's init (owner_exec.py)
            conn, wait = handed

            def ask_kill(signum: int, _frame: object) -> None:
                received.append(signum)
                try:
                    conn.sendall(b'{"kind": "kill"}\n')
                except OSError:
                    pass

            for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
                signal.signal(signum, ask_kill)
            code = wait()
            return 128 + received[0] if received else code
        where = sandboxes.target(record)
        with sandboxes.Running(record.session), raw_terminal(tty):
            proc = BoxExec(where, cmd, cwd=cwd, env=variables, user=sandboxes.user_of(where, user), tty=tty, guard=True)

            def on_signal(signum: int, _frame: object) -> None:
                received.append(signum)
                proc.kill()

            for signum in (signal.SIGTERM, signal.SIGHUP, *(() if tty else (signal.SIGINT,))):
                signal.signal(signum, on_signal)
            if tty:
                follow_window(proc)
            code = proc.wait_drained(limit)
    return 128 + received[0] if received else code


def run_box(cmd: list[str], options: BoxOptions, *, json_summary: bool, tty: bool = False, verbose: bool = False) -> int:
    from quinebox.api import Popen

    return supervise(lambda: Popen(cmd, options, tty=tty), json_summary=json_summary, tty=tty, verbose=verbose)


def shell_argv(tty: bool) -> list[str]:
    """The image's bash if it has one, else its sh; interactive only on a terminal."""
    chooser = 'if command -v bash >/dev/null 2>&1; then exec bash "$@"; fi; exec sh "$@"'
    return ["/bin/sh", "-c", chooser, "sh", *(["-i"] if tty else [])]


@app.command(help="An interactive shell in a fresh box, with this directory granted read-write (--read-only: read-only).")
def shell(
    grant: list[str] = typer.Option([], "-g", "--grant", metavar="SPEC", help="More grants, as for exec."),
    read_only: bool = typer.Option(False, "--read-only", help="Grant this directory read-only."),
    image: str | None = typer.Option(None, "--image", help="Any image that has /bin/sh (default: the agent image)."),
    pull: str = typer.Option("missing", "--pull", metavar="missing|always|never", help=PULL_HELP),
    timeout: str | None = typer.Option(None, "--timeout", metavar="DURATION", help="Wall-clock limit; exit 124 when reached."),
    env: list[str] = typer.Option([], "-e", "--env", metavar="NAME[=VALUE]", help="Pass one variable; same as -g env:…"),
    policy: str | None = typer.Option(None, "--policy", metavar="FILE.yaml|PRESET", help="Grants from a policy file or preset."),
) -> None:
    import os

    tty = sys.stdin.isatty()
    here = os.getcwd()
    grants = [f"{'ro' if read_only else 'rw'}:{here}", *grant, *(f"env:{e}" for e in env)]
    options = box_options(grants=grants, timeout=timeout, image=image, pull=pull, policy=policy)
    raise typer.Exit(run_box(shell_argv(tty), options, tty=tty, json_summary=False))


@app.command(
    context_settings={"allow_interspersed_args": False},
    help="Run CMD (default: a shell) inside a live box, as its user, within its limits; recorded on its tape. Only the box's owner may.",
)
def enter(
    session: str = typer.Argument(..., help="The box's session id (or a unique prefix), as `quinebox ps` shows it."),
    cmd: list[str] | None = typer.Argument(None, metavar="[-- CMD [ARGS...]]"),
) -> None:
    from quinebox.box.live.execs import enter_box
    from quinebox.box.live.freezing import refuse_if_paused

    tty = sys.stdin.isatty()
    cmd = cmd[1:] if cmd and cmd[0] == "--" else cmd  # parsing stops at SESSION, so `--` arrives as a word
    argv = cmd or shell_argv(tty)
    with reported(), raw_terminal(tty):
        refuse_if_paused(session)
        entered = enter_box(session, argv, tty=tty)
        if tty:
            follow_window(entered)
        code = entered.wait()
    record_entry(entered.target.session, argv, code)
    raise typer.Exit(code)


def record_entry(session: str, argv: list[str], code: int) -> None:
    """An agent's tape says who came in, with what, and how it ended."""
    import os

    from quinebox.agent.store import Tape
    from quinebox.state import session_dir

    if (session_dir(session) / "tape.jsonl").exists():
        tape = Tape(session)
        tape.append("entered", argv=argv, uid=os.getuid(), exit_code=code)
        tape.close()


@app.command("ps", help="List live boxes: id, command, age, owner.")
def ps_command() -> None:
    from quinebox.box.owners import listing

    with reported():
        rows = listing.live_boxes()
    listing.print_table(rows)


@app.command("kill", help="Kill a box and every box below it in its tree.")
def kill_command(session: str = typer.Argument(..., help="The box's session id (or a unique prefix).")) -> None:
    from quinebox.box.owners import listing

    with reported():
        killed = listing.kill_subtree(session)
    if not killed:
        say(f"no live box {session!r} (or more than one starts so): `quinebox ps` lists them")
        raise typer.Exit(125)
    say(f"killed {len(killed)} box{'es' if len(killed) != 1 else ''}: {' '.join(killed)}")


@app.command(
    "gc",
    help="Remove boxes whose owning quinebox process is gone, guest runtimes no box uses any more, snapshots left half made, "
    "and unpacked images no box uses whose image went, that no box used for `retention: {images:}`, or that changed.",
)
def gc_command() -> None:
    from quinebox.box.backends.docker.engine import DockerBackend
    from quinebox.box.images import guest_runtime
    from quinebox.box.live import sandboxes, snapshots
    from quinebox.box.owners import gc, listing
    from quinebox.box.spec import DEFAULT_IMAGE
    from quinebox.errors import EngineError

    with reported():
        removed = gc.collect_garbage(
            evicted=lambda name, why: say(f"removed unpacked image {name[:12]}: {why}; the next box of it unpacks it afresh"),
            unremoved=lambda session, why: say(f"did not remove box {session}: {why}"),
        )
        sandboxes.remove_stale({box.session for box in listing.live_boxes()})
        try:  # the guest runtimes are copied out of the engine's images, for its boxes: none without it
            engine = DockerBackend.connect()
        except EngineError:
            engine = None
        runtimes = guest_runtime.prune(engine, DEFAULT_IMAGE) if engine is not None else []
        unfinished = snapshots.sweep()
    say(f"removed {len(removed)} orphaned box{'es' if len(removed) != 1 else ''}" + (": " + " ".join(removed) if removed else ""))
    if unfinished:
        say(f"removed {len(unfinished)} snapshot(s) left half made, or of a fork whose maker is gone: {' '.join(unfinished)}")
    if runtimes:
        say(f"removed {len(runtimes)} guest runtime(s) of older agent images: {' '.join(runtimes)}")


@app.command(
    "doctor",
    help="Each way a box could run here (runc, crun, runsc, the Docker engine): works or not, and the one command that fixes it. "
    "Exit 0 when the default way is ready.",
)
def doctor_command(
    cluster: str | None = typer.Option(None, "--cluster", metavar="ADDRESS", help="Check every node of this Ray cluster instead: which can run boxes, and why not."),
    image: str | None = typer.Option(None, "--image", help="With --cluster: the image the nodes need (default quinebox's own)."),
) -> None:
    if cluster is None:
        from quinebox.box import doctor

        raise typer.Exit(doctor.run())
    from quinebox.cluster.connect import connect

    with reported():
        reports = connect(cluster).check_nodes(image)
    for report in sorted(reports, key=lambda r: (r["why"] is not None, r["host"], r["node"])):
        where = f"node {report['node'][:12]} ({report['host']})"
        say(f"ok    {where} runs boxes" if report["why"] is None else f"FAIL  {where}: {report['why']}")
    raise typer.Exit(0 if reports and all(r["why"] is None for r in reports) else 1)


@app.command("setup-user", help="As root, once: let the user NAME run boxes without root or the engine (a cgroup delegated for their limits, where systemd delegates none).")
def setup_user_command(name: str = typer.Argument(..., help="The user's login name.")) -> None:
    import os

    from quinebox.box.backends.rootless import local_hierarchy, setup_user
    from quinebox.errors import QuineboxError

    if os.geteuid() != 0:
        say(f"setup-user makes cgroups only root may make: run `sudo quinebox setup-user {name}`")
        raise typer.Exit(2)
    try:
        lines = setup_user(name, local_hierarchy())
    except (QuineboxError, OSError) as exc:
        say(f"cannot set up {name}: {exc}")
        raise typer.Exit(2) from None
    for line in lines:
        say(line)


@image_app.command("build", help="Build the agent image (bootstrapping the base offline when no registry is reachable).")
def image_build_command(
    base: str | None = typer.Option(None, "--base", help="Base image to build on (default: debian:bookworm-slim, else a debootstrapped one)."),
) -> None:
    from quinebox.box.backends.docker.engine import DockerBackend
    from quinebox.box.images.agent_image import build_image

    with reported():
        build_image(DockerBackend.connect(timeout=600), base=base)


@image_app.command("load", help="Unpack an image from a `docker save` tarball or an OCI layout (directory or tar): boxes of it then need no engine.")
def image_load_command(
    path: str = typer.Argument(..., help="The tarball (`docker save -o FILE IMAGE`) or the OCI image layout."),
    name: str | None = typer.Option(None, "--name", help="Which image, when it holds several (a tag, or an OCI ref.name)."),
) -> None:
    import os

    from quinebox.box.images.archives import from_docker_archive, from_oci_layout

    with reported():
        layout = os.path.isdir(path) or _holds_oci_index(path)
        info = (from_oci_layout if layout else from_docker_archive)(path, name)
        print(f"{info.name or info.id} {info.id}")


@image_app.command("share", help="As root: copy images into the machine's shared cache (/var/lib/quinebox/images), where every user's boxes find them without root or the engine.")
def image_share_command(names: list[str] = typer.Argument(None, help="The images (default quinebox's own agent image).")) -> None:
    from quinebox.box.configure import unpacked_image
    from quinebox.box.images.shared import share
    from quinebox.box.spec import DEFAULT_IMAGE

    with reported():
        for name in names or [DEFAULT_IMAGE]:
            info, tree = unpacked_image(name, pull="missing")
            print(f"{name} {info.id} {share(info, tree)}")


def _holds_oci_index(path: str) -> bool:
    """Whether a tar is an OCI layout (index.json and oci-layout at its top) rather than `docker save`'s."""
    import tarfile

    try:
        with tarfile.open(path) as tar:
            names = {member.name.lstrip("./") for member in tar.getmembers()[:64]}
    except (OSError, tarfile.TarError):
        return False
    return "oci-layout" in names and "manifest.json" not in names

"""`quinebox serve`: the per-user command server (in the foreground, or --background), `serve status`, `serve stop`."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import typer

from quinebox import fdpass
from quinebox.cli.app import app, reported, say
from quinebox.state import serve_socket


def warm() -> bool:
    """Import what commands load, so that workers inherit it instead of importing it each time; whether all of it is
    done (False: warm_bwrap's is left for the server to try again).

    Nothing here may start a thread or keep a connection open (a forked worker would share it), and nothing of quinebox
    may read a setting from the environment at import: settings are read when used, in the worker, from the client's."""
    import importlib

    for name in ("docker", "openai", "yaml", "rich.console", "cryptography.x509", "sqlite3", "quinebox.cli", "quinebox.api", "quinebox.agent.session",
                 "quinebox.tree.agent", "quinebox.tree.fanout", "quinebox.box.owners.listing", "quinebox.audit.approvals", "quinebox.worlds.tracker",
                 "quinebox.agent.diagnostics", "quinebox.agent.providers.script", "quinebox.agent.providers.openai", "typer._click.decorators",
                 "quinebox.box.backends.oci.launch", "quinebox.box.backends.oci.claim", "quinebox.box.images.rootfs", "quinebox.box.images.shared",
                 "quinebox.box.images.usage", "quinebox.tree.retention", "quinebox.box.backends.bwrap.launch"):
        importlib.import_module(name)
    from quinebox.box.backends.docker.engine import DockerBackend
    from quinebox.box.spec import seccomp_base
    from quinebox.cli import register
    from quinebox.cli.app import command
    from quinebox.errors import EngineError

    seccomp_base()
    from quinebox.box.images.rootfs import engine_names

    engine_names()  # read once here; a worker reads the engine's table again only when it has changed
    register()
    command()
    bwrap_warm = warm_bwrap()
    try:  # the engine's API version, so that a worker's first request is its own; the connection is closed before any fork
        engine = DockerBackend.connect(timeout=5)
        DockerBackend.known_version = (os.environ.get("DOCKER_HOST", ""), engine.api.api_version)
        engine.close()
    except EngineError:
        pass  # no engine yet: each worker asks it
    return bwrap_warm


#: The host ids warm_bwrap's box is rendered with: any unprivileged pair (a box is never host root); its filter and its
#: root's looks are the same for every box's own ids.
NOBODY = (65534, 65534)


def warm_bwrap() -> bool:
    """What a bwrap box's worker would compute for every default box, computed once here and inherited: bwrap keeps no
    warm box (a cold one is cheaper), so each served box is configured in its worker, and libseccomp's compile of the
    box's filter (~10 ms of CPU), pyseccomp's import (two `ldconfig -p` processes, to find its libraries) and the
    looks at its image's tree are cached per process (programs.seccomp_program, root.image_look). Only what is pure: no
    id is claimed, nothing made. False while the default image is not unpacked yet (a new state dir's server): the
    server tries again between commands (Server.warm_later), since every worker it forks before then pays for its own.
    True once done, or when there is nothing to do (no `bwrap` extra; a default box bwrap refuses)."""
    try:
        import pyseccomp  # noqa: F401 (the bwrap extra, when installed: imported once, not in every worker)
    except ImportError:
        return True
    from quinebox.box.backends.bwrap.policy import bwrap_box, bwrap_refusal, proc_kinds
    from quinebox.box.backends.bwrap.programs import seccomp_program
    from quinebox.box.backends.bwrap.root import image_look
    from quinebox.box.configure import with_argv
    from quinebox.box.images.rootfs import lookup, unpacked
    from quinebox.box.policy import RUNTIME, native_arch
    from quinebox.box.spec import build_spec, seccomp_base

    try:
        spec = build_spec(["true"])
        if bwrap_refusal(spec) is not None:
            return True
        image = lookup(spec.image)
        root = unpacked(image.id) if image is not None else None
        if image is None or root is None:
            return False
        rootfs = str(root)  # as the worker's configure names it (box/configure.py's unpacked_image): image_look is cached by it
        box = bwrap_box(with_argv(spec, image), image=image, runtime=f"{rootfs}{RUNTIME}", seccomp=seccomp_base(), arch=native_arch(), image_root=rootfs,
                        look=image_look(rootfs), host_ids=NOBODY, proc=proc_kinds())
        seccomp_program(box.seccomp, box.own_ids)  # as the worker compiles it (box.py): narrowed to the box's own ids
    except Exception:  # noqa: BLE001 (a warm-up never stops the server: the first bwrap box's worker meets the same and says it)
        pass
    return True


def status() -> dict[str, Any] | None:
    """What the server says of itself, or None when no server answers."""
    return fdpass.ask(serve_socket(), {"kind": "status"}, 5) or None


def stop() -> bool:
    return fdpass.ask(serve_socket(), {"kind": "stop"}, 5) is not None


serve_app = typer.Typer(help="A per-user command server: exec, run, map, batch and shell start without the CLI's start-up.")
app.add_typer(serve_app, name="serve")


def idle_after(option: str | None, configured: object) -> float | None:
    """Seconds of no command after which the server exits: `--idle`, else `serve: {idle: ...}` in config.yaml, else
    15 minutes; `never` (or 0) keeps it until `serve stop`."""
    from quinebox.cli.server import IDLE_DEFAULT
    from quinebox.errors import ErrorKind, GrantError, QuineboxError
    from quinebox.grants import parse_duration

    text = option
    if text is None and configured is not None:
        if not isinstance(configured, dict) or set(configured) - {"idle"}:
            raise QuineboxError("bad `serve:` in config.yaml: give a mapping with idle (serve: {idle: 15m}, or idle: never)", kind=ErrorKind.BAD_INPUT)
        text = configured.get("idle")
    if text is None:
        return IDLE_DEFAULT
    if text is False or str(text).strip().lower() in ("never", "0", "off"):  # YAML reads a bare `off` as false
        return None
    try:
        return parse_duration(str(text))
    except GrantError as exc:
        raise QuineboxError(f"bad idle time for the command server: {exc}", kind=ErrorKind.BAD_INPUT) from exc


@serve_app.callback(invoke_without_command=True)
def serve(
    ctx: typer.Context,
    background: bool = typer.Option(False, "--background", help="Detach, log to the state dir's serve.log, and return once it answers."),
    pool: int | None = typer.Option(
        None, "--pool", help="Warm boxes kept per shape (default 4; or `pool:` in config.yaml); 0: none."
    ),
    idle: str | None = typer.Option(
        None, "--idle", metavar="DURATION", help="Exit after this long with no command running (default 15m, or `serve: {idle: ...}` in config.yaml); never: only `serve stop`."
    ),
) -> None:
    if ctx.invoked_subcommand:
        return
    from quinebox.agent.providers import load_config
    from quinebox.box.pool.warm import Settings
    from quinebox.cli.server import Server
    from quinebox.state import open_private, state_dir

    with reported():
        config = load_config()
        configured = config.get("pool")
        server = Server(Settings.from_config(configured, pool), idle_after(idle, config.get("serve")))
        server.bind()
    if not warm():
        server.warm_later = warm_bwrap
    if background:
        if os.fork():
            assert server.listener is not None  # bound above
            server.listener.close()  # the child holds it now
            for _ in range(100):
                if status() is not None:
                    say(f"serving on {server.path}")
                    raise typer.Exit(0)
                time.sleep(0.05)
            say("the server did not answer; see serve.log in the state dir")
            raise typer.Exit(125)
        os.setsid()
        with reported():
            log = open_private(str(state_dir() / "serve.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)  # never through a link planted there
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
def status_command(as_json: bool = typer.Option(False, "--json", help="What the server and its pool say, as one JSON object.")) -> None:
    answer = status()
    if answer is None:
        say("no command server answers: `quinebox serve --background` starts one")
        raise typer.Exit(1)
    if as_json:
        print(json.dumps(answer))
        return
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(answer.get("since", 0)))
    idle = answer.get("idle_exit")
    exits = "until `quinebox serve stop`" if idle is None else f"exits after {idle:g} s with no command"
    print(f"serving: pid {answer.get('pid')}, since {since}, {answer.get('served')} command(s) served, {exits}")
    workers = answer.get("workers") or {}
    print(f"workers: {workers.get('running', 0)} running a command, {len(workers.get('free', []))} free for the next")
    pool = answer.get("pool")
    if not pool and answer.get("pool_after") is not None:
        print(
            f"pool: not started: it starts once the server has run {answer['pool_after']} commands within a minute"
            " (`serve --pool N`, or `pool: {after: 0}` in config.yaml, start it with the server)"
        )
        return
    if not pool:
        print("pool: none (`quinebox serve --pool N` keeps N warm boxes per shape)")
        return
    if pool.get("busy"):
        print(f"pool: pid {pool.get('pid')}, busy making its first warm boxes (ask again in a moment)")
        return
    settings = pool.get("settings", {})
    print(f"pool: pid {pool.get('pid')}, {settings.get('size')} warm per shape, idle shapes dropped after {settings.get('ttl'):g} s")
    print(f"{'SHAPE':<17} {'IMAGE':<13} {'WARM':>4} {'MAKING':>6} {'HITS':>6} {'MISSES':>6} {'CLAIM p50/p95/p99 ms':>22}")
    for shape in pool.get("shapes", []):
        cuts = "/".join("-" if shape.get(k) is None else f"{shape[k]:.1f}" for k in ("p50_ms", "p95_ms", "p99_ms"))
        print(f"{shape['shape']:<17} {shape['image']:<13} {shape['warm']:>4} {shape['making']:>6} {shape['hits']:>6} {shape['misses']:>6} {cuts:>22}")


@serve_app.command("stop", help="Stop the server; commands it is running go on to their end.")
def stop_command() -> None:
    if not stop():
        say("no command server answers")
        raise typer.Exit(1)
    say("stopped")

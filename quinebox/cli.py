"""The `quinebox` command. Parsing and presentation only: the work is in the modules it calls.

Heavy imports (docker, rich) happen inside the commands that need them, so
`quinebox exec` starts quickly.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
from typing import Any, Callable, Iterator, List, Optional

import typer

from quinebox import __version__
from quinebox.errors import QuineboxError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Run LLM agents and untrusted programs as processes in hardened containers.",
)
image_app = typer.Typer(no_args_is_help=True, help="The agent image.")
app.add_typer(image_app, name="image")
world_app = typer.Typer(no_args_is_help=True, help="A session's world: its revisions, their differences, an archive of one, adopting a child's changes.")
app.add_typer(world_app, name="world")

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE


def say(message: str) -> None:
    print(f"quinebox: {message}", file=sys.stderr, flush=True)


def fail(exc: QuineboxError) -> typer.Exit:
    say(str(exc))
    return typer.Exit(exc.exit_code)


@contextlib.contextmanager
def reported() -> Iterator[None]:
    """quinebox's own failures become one line on stderr and their exit code."""
    try:
        yield
    except QuineboxError as exc:
        raise fail(exc) from None


def version_callback(value: bool) -> None:
    if value:
        print(f"quinebox {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: bool = typer.Option(False, "--version", callback=version_callback, is_eager=True, help="Print the version."),
) -> None:
    pass


WORLD_HELP = "Bind this host directory as the box's /world, read-write."
WORLD_FROM_HELP = "Build /world from copies of these host paths (repeat the flag), or 'empty' (the default)."
WORLD_TAR_HELP = "Build /world from this tar archive (unsafe members refuse the whole archive)."


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


def supervise(start: Callable[[], Any], *, json_summary: bool) -> int:
    """Start one box wired to this process's stdio and map how it ended to our exit status.

    Signals we receive kill the box; we exit 128+n only once it is removed.
    """
    import time

    received: list[int] = []
    box = None

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)
        if box is not None:
            box.kill()

    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, on_signal)
    began = time.monotonic()
    with reported():
        box = start()
        if received:
            box.kill()
        code = box.wait()
    proc = getattr(box, "proc", box)
    if proc.timed_out:
        say(f"time limit of {proc.spec.grants.time:g} s reached; the box was killed")
    if proc.world_full:
        say(f"{proc.world_full}; the box was killed")
    if proc.oom_killed:
        from quinebox.grants import format_size
        from quinebox.policy import DEFAULT_MEM

        limit = format_size(proc.spec.grants.mem or DEFAULT_MEM)
        say(f"out of memory: the box hit its memory limit (mem:{limit}) and the kernel killed a process in it")
    if received:
        code = 128 + received[0]
    elif proc.broken_pipe:
        code = EXIT_BROKEN_PIPE
    if json_summary:
        summary: dict[str, Any] = {
            "exit_code": code,
            "timed_out": proc.timed_out,
            "oom_killed": proc.oom_killed,
            "duration_s": round(time.monotonic() - began, 3),
            "session": proc.session,
        }
        outcome = getattr(box, "outcome", None)
        if outcome:
            summary.update(termination=outcome["termination"], tokens=outcome["tokens"], turns=outcome["turns"])
        print(json.dumps(summary), file=sys.stderr, flush=True)
    return code


@app.command(help="Run an agent: MISSION is its task, stdin its material, stdout its deliverable, stderr its diagnostics.")
def run(
    mission: str = typer.Argument(..., help="What the agent should do."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Model name, script:FILE.yaml or replay:SESSION (default: QUINEBOX_MODEL)."),
    grant: List[str] = typer.Option([], "-g", "--grant", metavar="SPEC", help="A grant, as for exec (tokens:N caps the model budget)."),
    timeout: Optional[str] = typer.Option(None, "--timeout", metavar="DURATION", help="Wall-clock limit; exit 124 when reached."),
    max_turns: Optional[int] = typer.Option(None, "--max-turns", min=1, help="Model turns per conversation (default 40)."),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens", min=1, help="Token budget for the whole run."),
    image: Optional[str] = typer.Option(None, "--image", help="Image to run (built FROM the agent image)."),
    workdir: Optional[str] = typer.Option(None, "-w", "--workdir", help="Working directory inside the box."),
    policy: Optional[str] = typer.Option(None, "--policy", metavar="FILE.yaml|PRESET", help="Grants from a policy file or preset."),
    world: Optional[str] = typer.Option(None, "--world", metavar="DIR", help=WORLD_HELP),
    world_from: List[str] = typer.Option([], "--world-from", metavar="empty|PATH", help=WORLD_FROM_HELP),
    world_tar: Optional[str] = typer.Option(None, "--world-tar", metavar="FILE", help=WORLD_TAR_HELP),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No progress on stderr (the agent's own diagnostics still pass)."),
    json_summary: bool = typer.Option(False, "--json", help="Print one JSON summary line on stderr at the end."),
) -> None:
    from quinebox.agent import Agent
    from quinebox.diagnostics import make_view

    def start() -> Agent:
        return Agent(
            mission, model=model, grants=grant, timeout=timeout, max_turns=max_turns, max_tokens=max_tokens,
            image=image, workdir=workdir, policy=policy, view=make_view(quiet=quiet),
            world=world, world_from=world_from or None, world_tar=world_tar,
        )

    raise typer.Exit(supervise(start, json_summary=json_summary))


@app.command(help="Start a new session from a recorded one at TURN: its conversation up to that turn, its world as it was then, live from there.")
def fork(
    session: str = typer.Argument(..., help="The recorded session (or a unique prefix)."),
    at: int = typer.Option(..., "--at", min=1, help="The turn to go on from: the model answers it afresh."),
    mission: Optional[str] = typer.Option(None, "--mission", help="New instructions, given to the model after the recorded conversation."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Model for the new session (default: QUINEBOX_MODEL)."),
    grant: List[str] = typer.Option([], "-g", "--grant", metavar="SPEC", help="Grants (default: the recorded session's)."),
    timeout: Optional[str] = typer.Option(None, "--timeout", metavar="DURATION"),
    max_turns: Optional[int] = typer.Option(None, "--max-turns", min=1),
    quiet: bool = typer.Option(False, "-q", "--quiet"),
    json_summary: bool = typer.Option(False, "--json"),
) -> None:
    from quinebox.agent import Agent
    from quinebox.diagnostics import make_view
    from quinebox.tapes import find
    from quinebox.timeline import moment

    with reported():
        row = find(session)
        then = moment(row.id, at)
    history = list(then.messages)
    if mission:
        history.append({"role": "user", "content": f"New instructions from here on:\n\n{mission}"})

    def start() -> Agent:
        return Agent(
            mission or row.mission, model=model, grants=grant or then.meta.get("grants") or [], timeout=timeout, max_turns=max_turns,
            image=then.meta.get("image"), workdir=then.meta.get("workdir"), view=make_view(quiet=quiet),
            world_at=(row.id, then.revision), history=history, forked_from={"session": row.id, "turn": at, "revision": then.revision},
        )

    raise typer.Exit(supervise(start, json_summary=json_summary))


def fan_out(jobs_from: Callable[[], Any], *, out: str, options: Any, json_summary: bool) -> int:
    """Run jobs with progress on stderr; signals stop new starts and kill what runs."""
    from quinebox.fanout import Runner
    from quinebox.progress import make_progress

    with reported():
        jobs = jobs_from()
    received: list[int] = []
    with make_progress(len(jobs)) as progress:
        runner = Runner(jobs, out, options, progress)

        def on_signal(signum: int, _frame: object) -> None:
            received.append(signum)
            runner.stop(interrupted=True)

        for signum in FORWARDED_SIGNALS:
            signal.signal(signum, on_signal)
        code = runner.run()
    tally = runner.tally
    if tally.failures:
        say(f"{tally.failed} of {tally.total} failed: " + " ".join(tally.failures[:20]) + (" …" if len(tally.failures) > 20 else ""))
    if received:
        code = 128 + received[0]
        say(f"stopped: {tally.done} of {tally.total} finished; --resume runs the rest")
    if json_summary:
        summary = {"exit_code": code, "total": tally.total, "done": tally.done, "failed": tally.failed, "skipped": tally.skipped, "results": f"{out}/results.jsonl"}
        print(json.dumps(summary), file=sys.stderr, flush=True)
    return code


FANOUT_HELP = "Deliverables go to DIR/NAME.out, diagnostics to DIR/NAME.err, one line per input to DIR/results.jsonl. Exit 0 only when every input succeeded."


@app.command("map", help="Run one agent per input, the input as its material. " + FANOUT_HELP)
def map_command(
    mission: str = typer.Argument(..., help="The mission, the same for every input."),
    inputs: List[str] = typer.Argument(None, metavar="INPUTS...", help="Files or globs."),
    jsonl: Optional[str] = typer.Option(None, "--jsonl", metavar="FILE", help="One material per line, as a JSON string."),
    parallel: int = typer.Option(4, "--parallel", "-P", min=1, help="Agents at once."),
    out: str = typer.Option("quinebox-out", "--out", "-o", metavar="DIR", help="Where outputs and results.jsonl go."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="As for run."),
    grant: List[str] = typer.Option([], "-g", "--grant", metavar="SPEC", help="A grant for every agent."),
    image: Optional[str] = typer.Option(None, "--image"),
    timeout: Optional[str] = typer.Option(None, "--timeout", metavar="DURATION", help="Per agent."),
    max_turns: Optional[int] = typer.Option(None, "--max-turns", min=1),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens", min=1, help="Per agent."),
    retries: int = typer.Option(0, "--retries", min=0, help="Retry temporary failures (exit 75, engine hiccups), never an agent's own."),
    fail_fast: bool = typer.Option(False, "--fail-fast", help="Stop at the first failure, killing what runs."),
    resume: bool = typer.Option(False, "--resume", help="Skip inputs that results.jsonl says succeeded."),
    json_summary: bool = typer.Option(False, "--json", help="One JSON summary line on stderr at the end."),
) -> None:
    from quinebox.fanout import Options, map_jobs

    options = Options(parallel=parallel, retries=retries, fail_fast=fail_fast, resume=resume, max_turns=max_turns, max_tokens=max_tokens)
    common = {"grants": tuple(grant), "image": image, "model": model, "timeout": timeout}
    raise typer.Exit(fan_out(lambda: map_jobs(mission, inputs or [], jsonl, **common), out=out, options=options, json_summary=json_summary))


@app.command("batch", help="Run the jobs of a YAML file (mission, material or input, grants, image, model per job). " + FANOUT_HELP)
def batch_command(
    jobs_file: str = typer.Argument(..., metavar="JOBS.yaml"),
    parallel: int = typer.Option(4, "--parallel", "-P", min=1),
    out: str = typer.Option("quinebox-out", "--out", "-o", metavar="DIR"),
    max_turns: Optional[int] = typer.Option(None, "--max-turns", min=1),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens", min=1),
    retries: int = typer.Option(0, "--retries", min=0),
    fail_fast: bool = typer.Option(False, "--fail-fast"),
    resume: bool = typer.Option(False, "--resume"),
    json_summary: bool = typer.Option(False, "--json"),
) -> None:
    from quinebox.fanout import Options, batch_jobs

    options = Options(parallel=parallel, retries=retries, fail_fast=fail_fast, resume=resume, max_turns=max_turns, max_tokens=max_tokens)
    raise typer.Exit(fan_out(lambda: batch_jobs(jobs_file), out=out, options=options, json_summary=json_summary))


@app.command("ls", help="List recent sessions.")
def ls_command(limit: int = typer.Option(30, "-n", help="How many.")) -> None:
    from quinebox import tapes

    tapes.print_sessions(limit)


@app.command("show", help="Summarize one session: mission, turns, tool calls, outcome.")
def show_command(session: str) -> None:
    from quinebox import tapes

    with reported():
        tapes.print_show(session)


@app.command("logs", help="Print a session's tape; -f follows it while the agent runs.")
def logs_command(session: str, follow: bool = typer.Option(False, "-f", "--follow", help="Keep printing until the session ends.")) -> None:
    from quinebox import tapes

    with reported():
        tapes.print_logs(session, follow=follow)


@app.command("replay", help="Re-run a session's mission against its recorded answers; exit 0 when tool calls and outcome match.")
def replay_command(session: str, quiet: bool = typer.Option(False, "-q", "--quiet")) -> None:
    from quinebox import tapes

    with reported():
        raise typer.Exit(tapes.replay(session, quiet=quiet))


@app.command("ps", help="List live boxes: id, command, age, owner.")
def ps_command() -> None:
    from quinebox import boxes

    with reported():
        rows = boxes.live_boxes()
    boxes.print_table(rows)


@app.command("kill", help="Kill a box and every box below it in its tree.")
def kill_command(session: str = typer.Argument(..., help="The box's session id (or a unique prefix).")) -> None:
    from quinebox import boxes

    with reported():
        killed = boxes.kill_subtree(session)
    if not killed:
        say(f"no live box {session!r} (or more than one starts so): `quinebox ps` lists them")
        raise typer.Exit(125)
    say(f"killed {len(killed)} box{'es' if len(killed) != 1 else ''}: {' '.join(killed)}")


@app.command("tree", help="A session and every session it started: mission, status, exit code, duration, tokens, depth.")
def tree_command(session: str) -> None:
    from quinebox import tapes

    with reported():
        tapes.print_tree(session)


@app.command("gc", help="Remove boxes whose owning quinebox process is gone.")
def gc_command() -> None:
    from quinebox import boxes

    with reported():
        removed = boxes.collect_garbage()
    say(f"removed {len(removed)} orphaned box{'es' if len(removed) != 1 else ''}" + (": " + " ".join(removed) if removed else ""))


@app.command("doctor", help="Check the engine, the image and kernel support, and say how to fix what is missing.")
def doctor_command() -> None:
    from quinebox import doctor

    raise typer.Exit(doctor.run())


@world_app.command("log", help="A world's revisions: the turn and command that made each, paths changed, bytes.")
def world_log_command(session: str) -> None:
    from quinebox import worldlog

    with reported():
        worldlog.print_log(worldlog.resolve(session))


@world_app.command("diff", help="What revision REV (default: the newest) changed since --against (default: the one before it).")
def world_diff_command(
    session: str,
    rev: Optional[int] = typer.Argument(None, min=0),
    against: Optional[int] = typer.Option(None, "--against", min=0, metavar="REV"),
) -> None:
    from quinebox import worldlog

    with reported():
        worldlog.print_diff(worldlog.resolve(session), rev, against)


@world_app.command("export", help="Write a revision of a world (default: the newest) as a tar archive to stdout.")
def world_export_command(session: str, rev: Optional[int] = typer.Argument(None, min=0)) -> None:
    import os

    from quinebox import worldlog, worlds

    if os.isatty(1):
        say("stdout is a terminal: redirect it, as in `quinebox world export ID > world.tar`")
        raise typer.Exit(2)
    with reported():
        skipped = worlds.export(worldlog.resolve(session), rev, sys.stdout.buffer)
    if skipped:
        say(f"left out {len(skipped)} file(s) too large to keep: {' '.join(skipped[:10])}")


@world_app.command("adopt", help="Merge what CHILD changed in its inherited world into its parent's world.")
def world_adopt_command(
    child: str,
    force: bool = typer.Option(False, "--force", help="On a conflict (the parent changed the same path), take the child's version."),
) -> None:
    from quinebox import boxes, worldlog, worlds

    with reported():
        session = worldlog.resolve(child)
        spec, _ = worlds.load_spec(session)
        running = spec.base is not None and boxes.is_running(spec.base[0])
        parent, adopted = worlds.adopt(session, force=force, parent_running=running)
    for code, path in adopted:
        print(f"{code} {path}")
    say(f"adopted {len(adopted)} change(s) from {session} into {parent}'s world")


@world_app.command("commit", help="Take a revision of an ended session's world now (an agent's world gets one after each sh call).")
def world_commit_command(session: str) -> None:
    from quinebox import boxes, worldlog, worlds

    with reported():
        session = worldlog.resolve(session)
        if boxes.is_running(session):
            say(f"{session} is still running: its world is revised after each sh call; commit once it ends")
            raise typer.Exit(2)
        world = worlds.World.offline(session)
        try:
            record = world.revise("commit")
        finally:
            world.close()
    print(f"revision {record['rev']}: {record['files']} path(s) changed" if record else "no change since the newest revision")


@image_app.command("build", help="Build the agent image (bootstrapping the base offline when no registry is reachable).")
def image_build_command(
    base: Optional[str] = typer.Option(None, "--base", help="Base image to build on (default: debian:bookworm-slim, else a debootstrapped one)."),
) -> None:
    from quinebox.backends.docker import DockerBackend
    from quinebox.image import build_image

    with reported():
        build_image(DockerBackend.connect(), base=base)


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
    app()

"""Commands for agents and their sessions: `run`, `fork`, `resume`, `ls`, `show`, `logs`, `replay`, `tree`, `trace`, `prune`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from quinebox.cli.app import (
    ASK_HELP,
    ASK_TIMEOUT_HELP,
    BACKEND_HELP,
    DENY_HELP,
    OTEL_HELP,
    OTEL_INSTALL,
    PULL_HELP,
    RUNTIME_HELP,
    WORLD_FROM_HELP,
    WORLD_HELP,
    WORLD_TAR_HELP,
    app,
    backend_metavar,
    otel_installed,
    reported,
    say,
    supervise,
    tracing,
)

if TYPE_CHECKING:
    from quinebox.tree.agent import Agent


@app.command(help="Run an agent: MISSION is its task, stdin its material, stdout its deliverable, stderr its diagnostics.")
def run(
    mission: str = typer.Argument(..., help="What the agent should do."),
    model: str | None = typer.Option(None, "--model", "-m", help="Model name, script:FILE.yaml or replay:SESSION (default: QUINEBOX_MODEL)."),
    grant: list[str] = typer.Option([], "-g", "--grant", metavar="SPEC", help="A grant, as for exec (tokens:N caps the model budget)."),
    timeout: str | None = typer.Option(None, "--timeout", metavar="DURATION", help="Wall-clock limit; exit 124 when reached."),
    max_turns: int | None = typer.Option(None, "--max-turns", min=1, help="Model turns per conversation (default 40)."),
    max_tokens: int | None = typer.Option(None, "--max-tokens", min=1, help="Token budget for the whole run."),
    image: str | None = typer.Option(None, "--image", help="Any image with /bin/sh: the agent's sh runs the image's shell and tools (`host`: this machine's own)."),
    pull: str = typer.Option("missing", "--pull", metavar="missing|always|never", help=PULL_HELP),
    workdir: str | None = typer.Option(None, "-w", "--workdir", help="Working directory inside the box."),
    policy: str | None = typer.Option(None, "--policy", metavar="FILE.yaml|PRESET", help="Grants from a policy file or preset."),
    world: str | None = typer.Option(None, "--world", metavar="DIR", help=WORLD_HELP),
    world_from: list[str] = typer.Option([], "--world-from", metavar="empty|PATH", help=WORLD_FROM_HELP),
    world_tar: str | None = typer.Option(None, "--world-tar", metavar="FILE", help=WORLD_TAR_HELP),
    ask: list[str] = typer.Option([], "--ask", metavar="SPEC", help=ASK_HELP),
    deny: list[str] = typer.Option([], "--deny", metavar="SPEC", help=DENY_HELP),
    ask_timeout: str | None = typer.Option(None, "--ask-timeout", metavar="DURATION", help=ASK_TIMEOUT_HELP),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No progress on stderr (the agent's own diagnostics still pass)."),
    json_summary: bool = typer.Option(False, "--json", help="Print one JSON summary line on stderr at the end."),
    backend: str | None = typer.Option(None, "--backend", metavar=backend_metavar(), help=BACKEND_HELP),
    runtime: str | None = typer.Option(None, "--runtime", metavar="runc|crun|runsc|PATH", help=RUNTIME_HELP),
    otel: bool = typer.Option(False, "--otel", help=OTEL_HELP),
) -> None:
    from quinebox.agent.diagnostics import make_view
    from quinebox.cli.box import box_options  # here, not at the top: a module's import registers its commands (cli/__init__.py)
    from quinebox.tree.supervisor import start_agent

    trace = tracing(otel)
    options = box_options(
        grants=grant, timeout=timeout, image=image, pull=pull, workdir=workdir, policy=policy, world=world, world_from=world_from,
        world_tar=world_tar, ask=ask, deny=deny, ask_timeout=ask_timeout, backend=backend, runtime=runtime,
    )

    def start() -> Agent:
        return start_agent(mission, options, model=model, max_turns=max_turns, max_tokens=max_tokens, view=make_view(quiet=quiet))

    raise typer.Exit(supervise(start, json_summary=json_summary, trace=trace))


@app.command(help="Start a new session from a recorded one at TURN: its conversation up to that turn, its world as it was then, live from there.")
def fork(
    session: str = typer.Argument(..., help="The recorded session (or a unique prefix)."),
    at: int = typer.Option(..., "--at", min=1, help="The turn to go on from: the model answers it afresh."),
    mission: str | None = typer.Option(None, "--mission", help="New instructions, given to the model after the recorded conversation."),
    model: str | None = typer.Option(None, "--model", "-m", help="Model for the new session (default: QUINEBOX_MODEL)."),
    grant: list[str] = typer.Option([], "-g", "--grant", metavar="SPEC", help="Grants (default: the recorded session's)."),
    timeout: str | None = typer.Option(None, "--timeout", metavar="DURATION"),
    max_turns: int | None = typer.Option(None, "--max-turns", min=1),
    quiet: bool = typer.Option(False, "-q", "--quiet"),
    json_summary: bool = typer.Option(False, "--json"),
    otel: bool = typer.Option(False, "--otel", help=OTEL_HELP),
) -> None:
    from quinebox.agent.diagnostics import make_view
    from quinebox.agent.tapes import find
    from quinebox.agent.timeline import moment
    from quinebox.cli.box import box_options
    from quinebox.tree.supervisor import start_agent
    from quinebox.worlds.revisions import RevisionLog, unkept_entries

    trace = tracing(otel)
    with reported():
        row = find(session)
        then = moment(row.id, at)
        left = unkept_entries(RevisionLog(row.id).manifest(then.revision))
    if left:
        say(
            f"fork: revision {then.revision}'s world is made again without what its history could not keep: {'; '.join(left[:10])}"
            + (f"; and {len(left) - 10} more" if len(left) > 10 else "")
        )
    history = list(then.messages)
    if mission:
        history.append({"role": "user", "content": f"New instructions from here on:\n\n{mission}"})

    options = box_options(
        grants=grant or then.meta.get("grants") or [], timeout=timeout, image=then.meta.get("image"), workdir=then.meta.get("workdir"),
        world_at=(row.id, then.revision),
    )

    def start() -> Agent:
        return start_agent(
            mission or row.mission, options, model=model, max_turns=max_turns, view=make_view(quiet=quiet),
            history=history, forked_from={"session": row.id, "turn": at, "revision": then.revision},
        )

    raise typer.Exit(supervise(start, json_summary=json_summary, trace=trace))


@app.command(
    help="Go on with an interrupted session (its quinebox process was lost: killed, a reboot) from its last complete turn: its "
    "conversation, its world as it was then, its budgets as spent; the turn in flight runs again. stdin gives its material again, "
    "whole: what the session had read of it is passed over. The exit status is the agent's, as for run."
)
def resume(
    session: str = typer.Argument(..., help="The interrupted session (or a unique prefix): `quinebox ls` marks them."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No progress on stderr (the agent's own diagnostics still pass)."),
    json_summary: bool = typer.Option(False, "--json", help="Print one JSON summary line on stderr at the end."),
    backend: str | None = typer.Option(None, "--backend", metavar=backend_metavar(), help=BACKEND_HELP),
    runtime: str | None = typer.Option(None, "--runtime", metavar="runc|crun|runsc|PATH", help=RUNTIME_HELP),
    otel: bool = typer.Option(False, "--otel", help=OTEL_HELP),
) -> None:
    from quinebox.agent.diagnostics import make_view
    from quinebox.cli.box import box_options
    from quinebox.tree.resume import resume_agent

    trace = tracing(otel)
    where = box_options(backend=backend, runtime=runtime)  # checked as every command's are; the session's own box is remade

    def start() -> Agent:
        return resume_agent(session, view=make_view(quiet=quiet), say=lambda line: say(f"resume: {line}"), backend=where.backend, runtime=where.runtime)

    raise typer.Exit(supervise(start, json_summary=json_summary, trace=trace))


@app.command("ls", help="List recent sessions; one whose process was lost before it ended is marked interrupted (`quinebox resume` goes on with it).")
def ls_command(limit: int = typer.Option(30, "-n", help="How many.")) -> None:
    from quinebox.agent import tapes

    tapes.print_sessions(limit)


@app.command("show", help="Summarize one session: mission, turns, tool calls, outcome.")
def show_command(session: str) -> None:
    from quinebox.agent import tapes

    with reported():
        tapes.print_show(session)


@app.command("logs", help="Print a session's tape; -f follows it while the agent runs.")
def logs_command(session: str, follow: bool = typer.Option(False, "-f", "--follow", help="Keep printing until the session ends.")) -> None:
    from quinebox.agent import tapes

    with reported():
        tapes.print_logs(session, follow=follow)


@app.command("replay", help="Re-run a session's mission against its recorded answers; exit 0 when tool calls and outcome match.")
def replay_command(session: str, quiet: bool = typer.Option(False, "-q", "--quiet")) -> None:
    from quinebox.tree.replay import replay

    with reported():
        raise typer.Exit(replay(session, quiet=quiet))


@app.command("tree", help="A session and every session it started: mission, status, exit code, duration, tokens, depth.")
def tree_command(session: str) -> None:
    from quinebox.agent import tapes

    with reported():
        tapes.print_tree(session)


@app.command("trace", help="Export a recorded session and every session below it as OpenTelemetry spans to an OTLP/HTTP collector; prints the trace id.")
def trace_command(
    session: str,
    endpoint: str | None = typer.Option(
        None, "--endpoint", metavar="URL", help="The collector: http://HOST:4318 or its full traces URL (default: OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT, else localhost:4318)."
    ),
) -> None:
    import os

    from quinebox.agent.tapes import find

    if not otel_installed():
        say(f"trace needs the OpenTelemetry extra: {OTEL_INSTALL}")
        raise typer.Exit(2)
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        say("OTEL_SDK_DISABLED is true: nothing would be exported")
        raise typer.Exit(2)
    from quinebox.view.trace_export import export

    with reported():
        row = find(session)
        traces, problem = export([row.id], endpoint=endpoint)
    if problem:
        say(problem)
        raise typer.Exit(1)
    for trace_id in traces:
        print(trace_id)


@app.command(
    "prune",
    help="Remove finished sessions (tapes, worlds, revisions), the world objects only they named, their ended run records, "
    "and unpacked images as `gc` does. Nothing running or still needed goes.",
)
def prune_command(
    older_than: str | None = typer.Option(None, "--older-than", metavar="DURATION", help="Only sessions that ended this long ago or more (30m, 12h, 7d)."),
    keep: int | None = typer.Option(None, "--keep", metavar="N", help="Keep the newest N finished sessions whatever else is said."),
    failed: bool = typer.Option(False, "--failed", help="Only sessions whose exit status was not 0."),
    succeeded: bool = typer.Option(False, "--succeeded", help="Only sessions whose exit status was 0."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List what would go, and its size, and remove nothing."),
    retention: bool = typer.Option(False, "--retention", help="By `retention:` in config.yaml (age, count, size), as quinebox applies it once a day."),
) -> None:
    from datetime import datetime

    from quinebox.errors import QuineboxError
    from quinebox.grants import parse_duration
    from quinebox.tree.prune import Rules, RulesError, Selection, prune
    from quinebox.tree.retention import configured_limits

    with reported():
        if retention:
            if older_than is not None or keep is not None or failed or succeeded:
                raise RulesError("--retention prunes by config.yaml's `retention:` alone: drop --older-than, --keep, --failed and --succeeded")
            rules: Selection = configured_limits()
        else:
            if failed and succeeded:
                raise RulesError("--failed and --succeeded together match nothing: give one of them")
            try:
                age = parse_duration(older_than) if older_than is not None else None
            except QuineboxError as exc:
                raise RulesError(f"--older-than: {exc}") from None
            rules = Rules(older_than=age, keep=keep, outcome="failed" if failed else "succeeded" if succeeded else None)
        done = prune(rules, dry=dry_run)
    if dry_run:
        when = "%Y-%m-%d %H:%M:%S"
        for row, size in done.sessions:
            ended = datetime.fromtimestamp(row.ended or 0).strftime(when)
            print(f"{row.id}\t{ended}\t{row.exit_code}\t{size}\t{' '.join(row.mission.split())[:60]}")
        for image in done.images:  # the same columns: its id, when a box last used it, no status, bytes, why
            print(f"sha256:{image.name}\t{datetime.fromtimestamp(image.used).strftime(when)}\t-\t{image.size}\tunpacked image: {image.why}")
    for stayed in done.stayed:
        say(f"session {stayed.session} is pruned, but {_mb(stayed.bytes)} of {stayed.path} stay: {stayed.why}; the next prune tries again")
    verb = "would prune" if dry_run else "pruned"
    say(
        f"{verb} {len(done.sessions)} session(s), {_mb(done.session_bytes)}; {done.objects.objects} world object(s), {_mb(done.objects.bytes)}; "
        f"{done.runs} run record(s); {len(done.images)} unpacked image(s), {_mb(done.image_bytes)}"
    )


def _mb(size: int) -> str:
    return f"{size / 1e6:.1f} MB" if size >= 1e6 else f"{size / 1e3:.1f} kB"

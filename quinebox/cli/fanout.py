"""Commands for many inputs: `map` and `batch`."""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import typer

from quinebox.cli.app import ASK_HELP, ASK_TIMEOUT_HELP, DENY_HELP, FORWARDED_SIGNALS, OTEL_HELP, app, export_traces, reported, say, tracing

if TYPE_CHECKING:
    from quinebox.box.options import BoxOptions


def fan_out(jobs_from: Callable[[], Any], *, out: str, options: Any, json_summary: bool, cluster: str | None = None, forward_env: Sequence[str] = (),
            trace: str | None = None) -> int:
    """Run jobs with progress on stderr, here or on a cluster; signals stop new starts and kill what runs.

    With `trace` (the command's name), the run is exported as one trace once it ends: a span for the run, each
    input's tree under it."""
    from quinebox.tree.fanout import Runner
    from quinebox.tree.progress import make_progress

    with reported():
        jobs = jobs_from()
        connected = None
        if cluster is not None:
            from quinebox.cluster.connect import connect

            connected = connect(cluster, forward_env)
        elif forward_env:
            from quinebox.errors import QuineboxError

            raise QuineboxError("--forward-env is for --cluster: here the agents' broker already sees this environment")
        if options.parallel is None:
            options.parallel = connected.capacity() if connected else LOCAL_PARALLEL
    received: list[int] = []
    landed: dict[str, str] = {}  # each finished input's session, and the input's name
    began = time.time()
    with make_progress(len(jobs)) as shown:

        def progress(tally: Any, record: dict[str, Any] | None) -> None:
            if record and isinstance(record.get("session"), str):
                landed[record["session"]] = str(record.get("name"))
            shown(tally, record)

        if connected is not None:
            from quinebox.cluster.driver import ClusterRunner

            runner: Runner = ClusterRunner(jobs, out, options, progress, connected)
        else:
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
    if trace and landed:
        from quinebox.view.traces import Run

        export_traces(list(landed), Run(trace, began, time.time(), code, dict(landed)))
    if json_summary:
        summary = {"exit_code": code, "total": tally.total, "done": tally.done, "failed": tally.failed, "skipped": tally.skipped, "results": f"{out}/results.jsonl"}
        print(json.dumps(summary), file=sys.stderr, flush=True)
    return code


def checked_options(box: BoxOptions, **given: Any) -> Any:
    """The run's options, with `box`'s ask and deny rules checked once: a bad rule is one line and nothing starts, not
    a failure per input."""
    import os

    from quinebox.audit.asks import Asks
    from quinebox.tree.fanout import Options

    with reported():
        Asks.parse(box.ask, box.deny, box.ask_timeout, cwd=os.getcwd())
    return Options(ask=box.ask, deny=box.deny, ask_timeout=None if box.ask_timeout is None else str(box.ask_timeout), **given)


LOCAL_PARALLEL = 4
PARALLEL_HELP = f"Agents at once (default {LOCAL_PARALLEL}; with --cluster, the cluster's capacity)."
CLUSTER_HELP = "Run on a Ray cluster: ray://HOST:PORT, the head's HOST:PORT, or auto (RAY_ADDRESS, or `ray start` here). Needs quinebox[ray]."
FORWARD_HELP = "With --cluster: hand this environment variable (say, the provider's key) to the nodes' brokers; nothing is forwarded unless named."
FANOUT_HELP = "Deliverables go to DIR/NAME.out, diagnostics to DIR/NAME.err, one line per input to DIR/results.jsonl. Exit 0 only when every input succeeded."


@app.command("map", help="Run one agent per input, the input as its material. " + FANOUT_HELP)
def map_command(
    mission: str = typer.Argument(..., help="The mission, the same for every input."),
    inputs: list[str] = typer.Argument(None, metavar="INPUTS...", help="Files or globs."),
    jsonl: str | None = typer.Option(None, "--jsonl", metavar="FILE", help="One material per line, as a JSON string."),
    parallel: int | None = typer.Option(None, "--parallel", "-P", min=1, help=PARALLEL_HELP),
    out: str = typer.Option("quinebox-out", "--out", "-o", metavar="DIR", help="Where outputs and results.jsonl go."),
    model: str | None = typer.Option(None, "--model", "-m", help="As for run."),
    grant: list[str] = typer.Option([], "-g", "--grant", metavar="SPEC", help="A grant for every agent."),
    image: str | None = typer.Option(None, "--image"),
    timeout: str | None = typer.Option(None, "--timeout", metavar="DURATION", help="Per agent."),
    max_turns: int | None = typer.Option(None, "--max-turns", min=1),
    max_tokens: int | None = typer.Option(None, "--max-tokens", min=1, help="Per agent."),
    retries: int = typer.Option(0, "--retries", min=0, help="Retry temporary failures (exit 75, engine hiccups), never an agent's own."),
    fail_fast: bool = typer.Option(False, "--fail-fast", help="Stop at the first failure, killing what runs."),
    resume: bool = typer.Option(False, "--resume", help="Skip inputs that results.jsonl says succeeded."),
    ask: list[str] = typer.Option([], "--ask", metavar="SPEC", help=ASK_HELP),
    deny: list[str] = typer.Option([], "--deny", metavar="SPEC", help=DENY_HELP),
    ask_timeout: str | None = typer.Option(None, "--ask-timeout", metavar="DURATION", help=ASK_TIMEOUT_HELP),
    json_summary: bool = typer.Option(False, "--json", help="One JSON summary line on stderr at the end."),
    cluster: str | None = typer.Option(None, "--cluster", metavar="ADDRESS", help=CLUSTER_HELP),
    forward_env: list[str] = typer.Option([], "--forward-env", metavar="NAME", help=FORWARD_HELP),
    otel: bool = typer.Option(False, "--otel", help=OTEL_HELP),
) -> None:
    from quinebox.box.options import BoxOptions
    from quinebox.tree.fanout import map_jobs

    trace = "map" if tracing(otel) else None
    box = BoxOptions.of(grants=tuple(grant), image=image, timeout=timeout, ask=tuple(ask), deny=tuple(deny), ask_timeout=ask_timeout)
    options = checked_options(box, parallel=parallel, retries=retries, fail_fast=fail_fast, resume=resume, max_turns=max_turns, max_tokens=max_tokens)
    raise typer.Exit(fan_out(
        lambda: map_jobs(mission, inputs or [], jsonl, box, model=model),
        out=out, options=options, json_summary=json_summary, cluster=cluster, forward_env=forward_env, trace=trace,
    ))


@app.command("batch", help="Run the jobs of a YAML file (mission, material or input, grants, image, model per job). " + FANOUT_HELP)
def batch_command(
    jobs_file: str = typer.Argument(..., metavar="JOBS.yaml"),
    parallel: int | None = typer.Option(None, "--parallel", "-P", min=1, help=PARALLEL_HELP),
    out: str = typer.Option("quinebox-out", "--out", "-o", metavar="DIR"),
    max_turns: int | None = typer.Option(None, "--max-turns", min=1),
    max_tokens: int | None = typer.Option(None, "--max-tokens", min=1),
    retries: int = typer.Option(0, "--retries", min=0),
    fail_fast: bool = typer.Option(False, "--fail-fast"),
    resume: bool = typer.Option(False, "--resume"),
    ask: list[str] = typer.Option([], "--ask", metavar="SPEC", help=ASK_HELP),
    deny: list[str] = typer.Option([], "--deny", metavar="SPEC", help=DENY_HELP),
    ask_timeout: str | None = typer.Option(None, "--ask-timeout", metavar="DURATION", help=ASK_TIMEOUT_HELP),
    json_summary: bool = typer.Option(False, "--json"),
    cluster: str | None = typer.Option(None, "--cluster", metavar="ADDRESS", help=CLUSTER_HELP),
    forward_env: list[str] = typer.Option([], "--forward-env", metavar="NAME", help=FORWARD_HELP),
    otel: bool = typer.Option(False, "--otel", help=OTEL_HELP),
) -> None:
    from quinebox.box.options import BoxOptions
    from quinebox.tree.fanout import batch_jobs

    trace = "batch" if tracing(otel) else None
    box = BoxOptions.of(ask=tuple(ask), deny=tuple(deny), ask_timeout=ask_timeout)  # each job's grants, image and limit: its file's
    options = checked_options(box, parallel=parallel, retries=retries, fail_fast=fail_fast, resume=resume, max_turns=max_turns, max_tokens=max_tokens)
    raise typer.Exit(fan_out(lambda: batch_jobs(jobs_file), out=out, options=options, json_summary=json_summary, cluster=cluster, forward_env=forward_env, trace=trace))

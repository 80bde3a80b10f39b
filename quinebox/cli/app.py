"""The typer app and what its commands share: one line and an exit code for quinebox's failures, signals into exit statuses.

Heavy imports (docker, rich) happen inside the commands that need them, so
`quinebox exec` starts quickly.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any

import typer

from quinebox import __version__
from quinebox.errors import EXIT_QUINEBOX, QuineboxError

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


#: `--traceback` was given: quinebox's failures print their whole chain before their one line.
_traceback = False


def tracebacks() -> bool:
    """Whether a failure prints its chain: `--traceback`, or QUINEBOX_TRACEBACK set (to anything but 0)."""
    import os

    return _traceback or os.environ.get("QUINEBOX_TRACEBACK", "") not in ("", "0")


def chain(exc: BaseException) -> list[BaseException]:
    """`exc` and what it came from, the first cause first: each `__cause__`, or the `__context__` that `raise ... from
    None` hides from Python's own traceback (quinebox's one-line errors are raised so), but which is what happened."""
    links: list[BaseException] = []
    at: BaseException | None = exc
    while at is not None and all(at is not seen for seen in links):
        links.append(at)
        at = at.__cause__ or at.__context__
    return links[::-1]


def print_chain(exc: BaseException) -> None:
    """The whole chain of `exc` on stderr, each link's traceback, as Python prints one, and its kind and fields."""
    import traceback

    links = chain(exc)
    for i, link in enumerate(links):
        if i:
            follows = link.__cause__ is links[i - 1]
            print("\nThe above exception was the direct cause of the following exception:\n" if follows else
                  "\nDuring handling of the above exception, another exception occurred:\n", file=sys.stderr)
        print("".join(traceback.format_exception(link, chain=False)), end="", file=sys.stderr)
        if isinstance(link, QuineboxError):
            fields = "".join(f", {name}={value!r}" for name, value in link.fields.items())
            print(f"(kind={link.kind.value}{fields})", file=sys.stderr)
    sys.stderr.flush()


def fail(exc: QuineboxError) -> typer.Exit:
    """quinebox's failure as one line and its exit code; with --traceback, its whole chain before the line. An error
    whose line was said already (field `said`: the box's guest said it) is its exit code alone."""
    if tracebacks():
        print_chain(exc)
    if not exc.fields.get("said"):
        say(str(exc))
    return typer.Exit(exc.exit_code)


@contextlib.contextmanager
def reported() -> Iterator[None]:
    """quinebox's own failures become one line on stderr and their exit code."""
    try:
        yield
    except QuineboxError as exc:
        raise fail(exc) from None


_command: tuple[tuple[int, ...], Any] | None = None


def command() -> Any:
    """The click command typer builds from the app, once per process and again when commands were registered since
    (`quinebox serve` registers them all once it serves): a command server builds it before it forks.

    Calling it is what `app()` does, less the pretty exceptions the app turns off."""
    global _command
    registered = (len(app.registered_commands), *(len(group.typer_instance.registered_commands) for group in app.registered_groups if group.typer_instance))
    if _command is None or _command[0] != registered:
        _command = (registered, typer.main.get_command(app))
    return _command[1]


def run_app() -> None:
    """The app with every command registered, its failures one line: for `quinebox` itself and a command server's worker."""
    import errno

    from quinebox.tree.retention import due

    try:
        command()(prog_name="quinebox")  # the same name in usage lines whichever way it was started (quinebox.py, -m quinebox)
    except QuineboxError as exc:  # a command that did not say it itself
        raise SystemExit(fail(exc).exit_code) from None
    except OSError as exc:  # a full or read-only filesystem under us: one line, as for quinebox's own errors
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
            raise
        from quinebox.state import state_dir

        if tracebacks():
            print_chain(exc)

        where = f" {exc.filename}" if exc.filename else ""
        say(f"cannot write{where}: {exc.strerror}; free some space (the state dir is {state_dir()}) and run again")
        raise SystemExit(EXIT_QUINEBOX) from None
    finally:
        due()  # once a day, `retention:` is applied by a process of its own (tree/retention.py); else one stat


def version_callback(value: bool) -> None:
    if value:
        print(f"quinebox {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: bool = typer.Option(False, "--version", callback=version_callback, is_eager=True, help="Print the version."),
    traceback: bool = typer.Option(False, "--traceback", help="On a failure, print its whole chain of causes before its one line (also QUINEBOX_TRACEBACK=1)."),
) -> None:
    global _traceback
    _traceback = traceback


WORLD_HELP = "Bind this host directory as the box's /world, read-write."
WORLD_FROM_HELP = "Build /world from copies of these host paths (repeat the flag), or 'empty' (the default)."
WORLD_TAR_HELP = "Build /world from this tar archive (unsafe members refuse the whole archive)."


PULL_HELP = "When to pull the image: missing (default), always, never."
ASK_HELP = "Not held, but a person may approve it when the box asks (a grant spec: 'net:*', spawn:4, rw:~/src). Repeat the flag."
DENY_HELP = "Refuse whatever this covers, even when held, asked or remembered as always (a grant spec). Repeat the flag."
ASK_TIMEOUT_HELP = "How long a request waits for a person before it is denied (default 5m; 0 denies at once, as CI wants)."
TTY_HELP = "A pseudo-terminal in the box, wired to this terminal (needs a terminal on stdin)."


BACKEND_HELP = "Where boxes run: auto (the fastest backend that holds the box's policy and runs here: `quinebox doctor` says which), or a backend by name."


def backend_metavar() -> str:
    """--backend's metavar: every name a backend is asked by (registry.NAMES), so a backend's one registration line adds its own."""
    from quinebox.box.backends.registry import NAMES

    return "|".join(NAMES)
RUNTIME_HELP = "The OCI runtime: runc (default), crun, runsc (gVisor), or a path to any OCI runtime binary."


def check_backend(backend: str | None) -> None:
    """A --backend that names no backend is a usage error (exit 2), said in one line before anything starts. Only
    checked here: the command hands --backend and --runtime down in its box's options, never through this process's
    environment (QUINEBOX_BACKEND / QUINEBOX_RUNTIME are the user's default, read by box/backends/choice.py alone)."""
    from quinebox.box.backends.registry import NAMES

    if backend is not None and backend not in NAMES:
        say(f"bad --backend {backend!r}: use one of {', '.join(NAMES)}")
        raise typer.Exit(2)


def need_terminal(tty: bool) -> None:
    """`-t` without a terminal to give the box is a usage error, said at once (never a hang)."""
    if tty and not sys.stdin.isatty():
        say("the input device is not a TTY: -t gives the box this terminal, and stdin is not one; drop -t when piping")
        raise typer.Exit(125)


@contextlib.contextmanager
def raw_terminal(tty: bool) -> Iterator[None]:
    """This terminal in raw mode while a box owns it (Ctrl-C, Ctrl-Z are bytes for the box), restored however we leave."""
    if not tty:
        yield
        return
    import termios
    import tty as terminal

    saved = termios.tcgetattr(0)
    terminal.setraw(0)
    try:
        yield
    finally:
        termios.tcsetattr(0, termios.TCSADRAIN, saved)


def follow_window(box: Any) -> None:
    """Give the box's terminal this one's size, now and whenever it changes."""
    import os

    def resize(*_: object) -> None:
        size = os.get_terminal_size(0)
        box.resize(size.lines, size.columns)

    signal.signal(signal.SIGWINCH, resize)
    resize()


OTEL_HELP = "Export the tree as OpenTelemetry spans when it ends (on too when OTEL_EXPORTER_OTLP_ENDPOINT is set). Needs quinebox[otel]."
#: What traces need, beyond the plain install.
OTEL_MODULES = ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http")
OTEL_INSTALL = "pip install 'quinebox[otel]'"


def otel_installed() -> bool:
    import importlib.util

    try:
        return all(importlib.util.find_spec(name) is not None for name in OTEL_MODULES)
    except ImportError:
        return False


def tracing(flag: bool) -> bool:
    """Whether this command exports its tree's spans at the end: `--otel`, or an OTLP endpoint in the environment as every
    OpenTelemetry SDK reads it (unless OTEL_SDK_DISABLED). Decided before anything starts: `--otel` without the extra is
    a usage error, an endpoint in the environment without it one line and no traces."""
    import os

    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    named = [v for v in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT") if os.environ.get(v)]
    if not (flag or named):
        return False
    if otel_installed():
        return True
    if flag:
        say(f"--otel needs the OpenTelemetry extra: {OTEL_INSTALL}")
        raise typer.Exit(2)
    say(f"{named[0]} is set, but quinebox's traces need the OpenTelemetry extra ({OTEL_INSTALL}): not exporting")
    return False


def export_traces(roots: list[str], run: Any = None) -> None:
    """Send the finished trees' spans; whatever happens, one line at most and never a different exit status."""
    try:
        from quinebox.view.trace_export import export

        _, problem = export(roots, run)
    except Exception as exc:  # noqa: BLE001 - a trace is an extra: no failure of it may change how the run ended
        problem = f"traces: not exported: {type(exc).__name__}: {exc}"
    if problem:
        say(problem)


def supervise(start: Callable[[], Any], *, json_summary: bool, tty: bool = False, verbose: bool = False, trace: bool = False) -> int:
    """Start one box wired to this process's stdio and map how it ended to our exit status.

    Signals we receive kill the box; we exit 128+n only once it is removed.
    With `tty`, the box gets this terminal, in raw mode until the box is gone.
    With `trace`, the tree's spans are exported once it is gone, before the JSON summary (which stays the last line).
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
    with reported(), raw_terminal(tty):
        box = start()
        if tty:
            follow_window(box)
        if received:
            box.kill()
        code = box.wait()
    proc = getattr(box, "proc", box)
    if verbose:
        say(proc.choice.why)
    if proc.timed_out:
        say(f"time limit of {proc.spec.grants.time:g} s reached; the box was killed")
    if proc.world_full:
        say(f"{proc.world_full}; the box was killed")
    if proc.engine_lost:
        say(
            f"{proc.engine_lost}; the box is stopped through its lifeline, `quinebox doctor` says what happened, "
            "and `quinebox gc` removes what is left once the engine answers again"
        )
    if proc.sandbox_died:
        say(proc.sandbox_died)
    if proc.oom_killed:
        from quinebox.box.policy import DEFAULT_MEM
        from quinebox.grants import format_size

        limit = format_size(proc.spec.grants.mem or DEFAULT_MEM)
        say(f"out of memory: the box hit its memory limit (mem:{limit}) and the kernel killed a process in it")
    if received:
        code = 128 + received[0]
    elif proc.broken_pipe:
        code = EXIT_BROKEN_PIPE
    if trace and proc.session:
        export_traces([proc.session])
    if json_summary:
        summary: dict[str, Any] = {
            "exit_code": code,
            "timed_out": proc.timed_out,
            "oom_killed": proc.oom_killed,
            "duration_s": round(time.monotonic() - began, 3),
            "session": proc.session,
            "backend": proc.choice.runtime or proc.choice.backend,
        }
        outcome = getattr(box, "outcome", None)
        if outcome:
            summary.update(termination=outcome["termination"], tokens=outcome["tokens"], turns=outcome["turns"])
        print(json.dumps(summary), file=sys.stderr, flush=True)
    return code

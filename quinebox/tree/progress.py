"""Progress of a fan-out on stderr: a live bar on a terminal, plain lines otherwise."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from typing import Any

from quinebox.tree.fanout import Progress, Tally


@contextlib.contextmanager
def make_progress(total: int) -> Iterator[Progress]:
    if sys.stderr.isatty():
        with _bar(total) as progress:
            yield progress
        return
    began = time.monotonic()

    def plain(tally: Tally, record: dict[str, Any] | None) -> None:
        if record is None:
            return
        status = "ok" if record["exit_code"] == 0 else f"FAILED (exit {record['exit_code']})"
        rate = tally.done / max(1e-9, time.monotonic() - began)
        print(
            f"quinebox: [{tally.done}/{tally.total}] {status} {record['input']} in {record['duration_s']:.1f} s"
            f" — {tally.failed} failed, {tally.running} running, {rate:.2f}/s",
            file=sys.stderr,
            flush=True,
        )

    yield plain


@contextlib.contextmanager
def _bar(total: int) -> Iterator[Progress]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    bar = Bar(
        TextColumn("[bold]quinebox[/bold]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("[red]{task.fields[failed]} failed[/red] · {task.fields[running]} running · {task.fields[rate]}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        transient=False,
    )
    began = time.monotonic()
    with bar:
        task = bar.add_task("map", total=total, failed=0, running=0, rate="")

        def update(tally: Tally, _record: dict[str, Any] | None) -> None:
            rate = tally.done / max(1e-9, time.monotonic() - began)
            bar.update(task, completed=tally.done, failed=tally.failed, running=tally.running, rate=f"{rate:.2f}/s")

        yield update

"""Sending a tree's spans to an OTLP collector: read the record, build the spans (traces.py), replay them through the
OpenTelemetry SDK with their recorded times, and export them in one go under a deadline.

Imported only when a trace is asked for (`--otel`, an OTEL_EXPORTER_OTLP_* endpoint, `quinebox trace`): the plain
path never loads the SDK. The spans are collected in memory and exported by one call per batch rather than
through a background processor, so an unreachable collector costs at most EXPORT_DEADLINE seconds and one line
from us (the SDK's own log lines are kept off stderr), and never a run's exit status or output.
The endpoint, headers, TLS files and compression come from the standard OTEL_EXPORTER_OTLP_* variables, read
by the SDK itself; `endpoint` overrides only the URL.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

from quinebox import __version__
from quinebox.agent.store import Index, SessionRow, read_tape
from quinebox.audit.boxes import CREATED, ENDED, box_lives
from quinebox.audit.log import AuditLog
from quinebox.view.redact import Redactor, secret_names
from quinebox.view.traces import Run, Span, build

#: Seconds an export may take in all (unless OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT says otherwise).
EXPORT_DEADLINE = 4.0
#: Spans per request, so that a big tree never meets a collector's request size limit.
BATCH = 512
DEFAULT_ENDPOINT = "http://localhost:4318/v1/traces"


def gather(roots: Sequence[str]) -> tuple[dict[str, SessionRow], dict[str, list[Any]], list[dict[str, Any]]]:
    """The index rows of every session under `roots`, their tapes, and the audit log's box records.

    The tree is walked through both: a command box (`quinebox exec` in a box) has no row, but the agents it
    starts in turn do."""
    audit = [r for r in AuditLog().records() if r.get("kind") in (CREATED, ENDED)]
    boxes_below: dict[str, list[str]] = {}
    for box in box_lives(audit).values():
        if box.parent is not None:
            boxes_below.setdefault(box.parent, []).append(box.session)
    rows: dict[str, SessionRow] = {}
    index = Index()
    try:
        pending, seen = list(roots), set()
        while pending:
            session = pending.pop()
            if not isinstance(session, str) or session in seen:
                continue
            seen.add(session)
            row = index.get(session)
            if row is not None and row.id == session:
                rows[session] = row
                pending += [child.id for child in index.children(session)]
            pending += boxes_below.get(session, [])
    finally:
        index.close()
    return rows, {session: read_tape(session) for session in rows}, audit


def spans_for(roots: Sequence[str], run: Run | None = None) -> list[Span]:
    """The spans of the trees under `roots`, every text scrubbed of the credentials this process can see."""
    rows, tapes, audit = gather(roots)
    grants = [g for box in box_lives(audit).values() for g in box.grants]
    grants += [g for tape in tapes.values() for r in tape[:1] if isinstance(r, dict) for g in r.get("grants") or [] if isinstance(g, str)]
    redactor = Redactor(extra_names=secret_names(grants))
    # Scrubbed before the builder cuts long texts (a cut could keep the first half of a secret), and again after.
    rows = {session: replace(row, mission=redactor.text(row.mission)) for session, row in rows.items()}
    spans = build(roots, rows, {session: redactor.scrub(tape) for session, tape in tapes.items()}, audit, run)
    for span in spans:
        span.name = redactor.text(span.name)
        span.error = None if span.error is None else redactor.text(span.error)
        for key, value in span.attributes.items():
            if isinstance(value, str):
                span.attributes[key] = redactor.text(value)
            elif isinstance(value, (list, tuple)):
                span.attributes[key] = [redactor.text(v) if isinstance(v, str) else v for v in value]
    return spans


def where(endpoint: str | None = None) -> str:
    """The traces URL an export goes to: `endpoint` (a bare collector address gets the traces path), else the SDK's choice."""
    if endpoint:
        return endpoint.rstrip("/") + "/v1/traces" if endpoint.rstrip("/").count("/") == 2 else endpoint
    if os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + "/v1/traces"
    return DEFAULT_ENDPOINT


@contextlib.contextmanager
def sdk_quiet() -> Iterator[None]:
    """The SDK's log lines off stderr while we export: a failure is said once, by us."""
    logger = logging.getLogger("opentelemetry")
    handler = logging.NullHandler()
    saved = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = saved


def replayed(spans: Sequence[Span]) -> list[Any]:
    """The spans as the SDK's finished spans, with their recorded times and parents."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context

    resource = Resource.create({"service.version": __version__})
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "quinebox"}))
    provider = TracerProvider(resource=resource)
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("quinebox", __version__)
    made: list[Any] = []
    for span in spans:
        parent = made[span.parent] if span.parent is not None and span.parent < len(made) else None
        context = set_span_in_context(parent) if parent is not None else None
        kind = SpanKind.CLIENT if span.kind == "client" else SpanKind.INTERNAL
        live = tracer.start_span(span.name, context=context, kind=kind, attributes=span.attributes, start_time=span.start_ns)
        if span.error is not None:
            live.set_status(Status(StatusCode.ERROR, span.error))
        made.append(live)
    for live, span in zip(made, spans, strict=True):
        live.end(end_time=span.end_ns)
    finished = list(memory.get_finished_spans())
    provider.shutdown()
    return finished


def emit(spans: Sequence[Span], endpoint: str | None = None) -> tuple[list[str], str | None]:
    """Export the spans: (the traces' ids, None when the collector took them all, else one line saying what did not happen)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    timeout_set = any(os.environ.get(v) for v in ("OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"))
    url = where(endpoint)
    results: list[bool] = []
    with sdk_quiet():
        finished = replayed(spans)
        if not finished:  # OTEL_SDK_DISABLED, or a sampler that keeps none
            return [], None
        exporter = OTLPSpanExporter(endpoint=url, timeout=None if timeout_set else EXPORT_DEADLINE)

        def send() -> None:
            for first in range(0, len(finished), BATCH):
                results.append(exporter.export(finished[first : first + BATCH]) is SpanExportResult.SUCCESS)
                if not results[-1]:
                    return

        sender = threading.Thread(target=send, name="otlp-export", daemon=True)
        sender.start()
        sender.join(EXPORT_DEADLINE + 2 if not timeout_set else None)
        exporter.shutdown()
    traces = list(dict.fromkeys(f"{span.context.trace_id:032x}" for span in finished if span.parent is None))
    if sender.is_alive() or not results or not all(results):
        return traces, f"traces: could not export {len(finished)} span(s) to {url} (no collector took them); the run itself is unaffected"
    return traces, None


def export(roots: Sequence[str], run: Run | None = None, endpoint: str | None = None) -> tuple[list[str], str | None]:
    """Build and send the trees' spans: (the ids of the traces sent, a line to say when they did not reach the collector)."""
    spans = spans_for(roots, run)
    return emit(spans, endpoint) if spans else ([], None)

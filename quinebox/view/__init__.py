"""`quinebox view` and traces: what the state dir records, drawn as a live web page or exported as OpenTelemetry spans.

An optional extra (`quinebox[view]`, `quinebox[otel]`): nothing on the plain path imports this package.
The view only reads the state dir, except for one write a person may make from the page when the server
was started with `--allow-approve`: a decision on a pending approval, made as `quinebox approve` makes it.

    app.py            the web server: a Starlette app of JSON routes, one event stream, the page's static files
    serve.py          serving it: a listening socket first (so `--port 0` can print its port), then uvicorn on it
    catalog.py        everything the view can show, in one place: what the server routes to, what an export walks
    sessions_view.py  sessions, a session's process tree, one agent's transcript
    worlds_view.py    a session's world: its revisions, what each changed, its files at any revision
    runs_view.py      map and batch runs, each joined with its results
    audit_view.py     the audit log, read once, then only what was appended since
    redact.py         what must never leave the viewer's process: a secret's value, a provider key, the audit key
    export.py         `quinebox view --export DIR`: the same page as a static bundle
    traces.py         a finished tree as OpenTelemetry spans, built from what quinebox already records
    trace_export.py   those spans sent to an OTLP collector
"""

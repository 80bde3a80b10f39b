"""`quinebox view` and traces: what the state dir records, drawn as a live web page or exported as OpenTelemetry spans.

An optional extra (`quinebox[view]`, `quinebox[otel]`): nothing on the plain path imports this package.
The view only reads the state dir, except for one write a person may make from the page when the server
was started with `--allow-approve`: a decision on a pending approval, made as `quinebox approve` makes it.
"""

"""Authority on the record: the hash-chained audit log, and asking a human before a box gets more.

Owns the append-only log of every authority decision (log.py), the `ask:` and
`deny:` rules and how a request is classified against them (asks.py), the
pending requests, decisions and remembered rules in the state dir
(approvals.py), the request itself (request.py), putting a request to a
person on their terminal (prompt.py), and what the log says of each box's
life (boxes.py).

May import only the foundation modules: boxes, agents and the tree all record
here and ask here, so nothing here knows of them.
"""

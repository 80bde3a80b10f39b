"""The host side of one agent: its session and budgets, the providers it asks, its tape and the index.

An `AgentSession` (session.py) answers the frames an agent's box sends over its socket; it never starts boxes
itself. Its budgets (budgets.py: turns, exec cycles, tokens shared with its subtree) and where its answers come
from (providers/: an OpenAI-compatible endpoint, a script, a recorded tape) are its own. Sessions on disk are
store.py's (each session's tape and the SQLite index), read through one typed schema per record (records.py)
and one walk over a tape's tool calls (tool_calls.py). Also here: reading sessions back (tapes.py, timeline.py),
where an interrupted one goes on from (resumption.py), and showing an agent's progress (diagnostics.py).

May import: box (the frame helpers of its broker), worlds (a session revises
its box's world), and the foundation modules. Never the tree.
"""

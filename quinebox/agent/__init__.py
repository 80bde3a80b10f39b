"""The host side of one agent: its session and budgets, the providers it asks, its tape and the index.

An `AgentSession` answers the frames an agent's box sends over its socket;
it never starts boxes itself. Also here: reading sessions back (tapes.py,
timeline.py) and showing an agent's progress (diagnostics.py).

May import: box (the frame helpers of its broker), worlds (a session revises
its box's world), and the foundation modules. Never the tree.
"""

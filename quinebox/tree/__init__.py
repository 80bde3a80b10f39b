"""The process tree of one root quinebox process, and fan-out over many inputs.

Owns each box's `Node` (supervisor.py: attenuation, budgets, starting and
killing children), `Agent` (a box, its session and its node tied together),
`replay`, and `map`/`batch` with their progress display.

May import: agent, box, worlds and the foundation modules. Only the front
(cli, api) imports the tree.
"""

"""The process tree of one root quinebox process, and fan-out over many inputs.

Owns each box's `Node` (supervisor.py: attenuation, budgets, starting and killing children), `Agent` (agent.py:
a box, its session and its node tied together), `map`/`batch` (fanout.py) with their progress display
(progress.py) and each run's record (runs.py), running a recorded mission again (replay.py), going on with an
interrupted session (resume.py), and finished sessions leaving the state dir (prune.py, by `retention:` in
config.yaml: retention.py).

May import: agent, box, worlds and the foundation modules. Only the front
(cli, api) imports the tree.
"""

"""Boxes that last: long-lived sandboxes, the commands run in them, and entering them.

Holds the long-lived boxes' records (sandboxes.py), their files read, written,
listed and copied as tars from inside them (box_files.py; what an exec sends
them, bounded by the host: capped.py), the holder process
that owns one made to outlive its maker (holders.py), a command run beside a
box's main process (execs.py, started by the box's init or by its backend's
own exec: exec_ways.py; one in a box another process owns is handed to its
owner: handed.py, as `exec --in` is: owner_exec.py), entering a box among
them; pausing a box (freezing.py), its snapshots in the state dir
(snapshots.py), what one carries and refuses (snapshot_rules.py) and taking
one (checkpoints.py), and a box's owner answering for it to the user's other
processes (controls.py).

May import: owners, backends, the box's rules, streams and below.
"""

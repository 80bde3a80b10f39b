"""Boxes that last: long-lived sandboxes, the commands run in them, and entering them.

Holds the long-lived boxes' records and their files (sandboxes.py), a command
run beside a box's main process (execs.py, each in its own cgroup:
exec_cgroups.py, started in each backend's way: exec_ways.py), entering a box among them.

May import: owners, backends, the box's rules, streams and below.
"""

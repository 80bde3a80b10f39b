"""Worlds: each box's /world, built for its task, kept with its revisions, rolled back and adopted.

Owns where a world comes from (spec.py), making one (build.py), a world in
use (world.py), the object store and revision log (revisions.py), making a
recorded world real on the host or as a tar stream (materialize.py), a world
no box runs in made as it was at a revision (rewind.py), the inotify tracker
(tracker.py), access that never leaves a world's root (beneath.py), adopting
a child's changes (adopt.py), objects no world names leaving the store
(sweep.py), and reading worlds back (history.py).

May import only the foundation modules (errors, grants, state): a world knows
nothing of containers, so boxes, agents and the tree may all use it.
"""

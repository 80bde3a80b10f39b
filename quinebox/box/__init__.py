"""One hardened box: what it may do, and running it.

Owns the grants' resolution into a `BoxSpec` (spec.py), the one pure function
from a spec to the container configuration (policy.py), the engine backend,
the image, the byte streams, the host end of the box's socket (broker.py)
and its egress proxy (egress.py, handover.py, proxywire.py, secrets.py), `BoxProcess` (process.py), noticing an engine
gone quiet (watch.py), and finding boxes by label for ps/kill/gc.

May import: worlds (a box mounts one), the foundation modules and
guest.protocol. Knows nothing of agents or the tree: a box's place in a tree
reaches it as a `Place` it is handed.
"""

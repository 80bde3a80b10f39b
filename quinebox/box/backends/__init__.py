"""Where boxes run: the Docker engine, the OCI runtimes and bubblewrap, each behind one seam, and which one.

The seam: a backend as shared code sees it (seam.py: its launch, warm boxes,
shapes, reopened boxes and doctor's way), one box as every backend lists it
(boxes.py: the Box protocol with every operation on a box, its Capabilities,
and an exec's Way), and every backend by name, one registration line each
(registry.py). A capability a backend lacks is answered by the caller in one
line; nothing outside this room asks which backend a box is on.

Each backend is one room, its seam object (backend.py) inside it: the engine's
(docker/: its thin layer engine.py, box, launch, warm boxes) and the OCI
runtimes' (oci/: runc, crun and gVisor's runsc, with their thin layer
runtime.py, boxes, roots, ids, freezer, CRIU check, launch, warm boxes
and claims) and bubblewrap's (bwrap/: each box one bwrap process, its policy as
bwrap's argv, its root, its cgroups, its boxes as listed). Shared by all: each exec's own cgroup
(exec_cgroups.py), which backend a box runs on (choice.py, probe.py), a plain
user's boxes (rootless.py), each way a box could run here and its fix
(ways.py, reach.py), noticing an engine gone quiet (watch.py), and what removes a runtime's or bwrap's boxes when their
holder dies (keeper.py).

May import: the box's rules (spec, policy), streams and below; registry.py and
each backend's backend.py rank above run/ and pool/ (they reach each backend's
launch and warm modules).
"""

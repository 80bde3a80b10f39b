"""Warm boxes: started ahead of demand per shape, and claimed by the request they fit.

Holds the pool of warm boxes per shape, over each backend's maker (warm.py),
a warm box on the engine (warm_docker.py) and on an OCI runtime (warm_oci.py),
the pool's keeper process, which asks each shape's backend (keeper.py), and
claiming one, with the record of whose box it became (claim.py; on a runtime:
claim_oci.py).

May import: configure, images, backends, the box's rules, net, streams and
below.
"""

"""Warm boxes: started ahead of demand per shape, and claimed by the request they fit.

Holds the pool of warm boxes per shape, over each backend's maker (warm.py),
the pool's keeper process, which asks each shape's backend (keeper.py), and
claiming one, with the record of whose box it became (claim.py). Each
backend's own warm box lives in its room (backends/docker/warm.py,
backends/oci/warm.py and claim.py), ranked at this tier.

May import: configure, images, backends, the box's rules, net, streams and
below.
"""

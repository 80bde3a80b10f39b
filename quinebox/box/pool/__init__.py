"""Warm boxes: started ahead of demand per shape, and claimed by the request they fit.

Holds the pool's keeper process and its boxes (warm.py) and claiming one, with
the record of whose box it became (claim.py).

May import: configure, images, backends, the box's rules, net, streams and
below.
"""

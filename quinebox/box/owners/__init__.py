"""Every box of every backend, found through its labels and its owner: ps, kill and gc.

There is no daemon: each quinebox process owns its boxes, and whatever lists
or collects them reads the labels of each backend's Box objects: ps and kill
(listing.py), and collecting what dead owners left (gc.py).

May import: pool (a claimed box's record), images (unpacked images that gc
repairs), backends, the box's rules and below.
"""

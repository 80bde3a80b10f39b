"""`map`, `batch` and `Box.map` on a Ray cluster: Ray places the inputs, each node runs boxes on its own engine.

    connect.py  the driver's link to a cluster: the address, Ray itself, the capacity, the forwarded environment
    node.py     what runs on a worker node: its readiness check and one attempt at one input
    driver.py   the driver: each input dispatched as a Ray task, its outputs streamed back and committed once
    commit.py   what lands on the driver, once per input: an attempt's staged outputs, its sessions and their tapes

Nothing here is imported unless a cluster is asked for, so Ray stays an optional extra.
"""

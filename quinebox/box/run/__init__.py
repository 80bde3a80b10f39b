"""A box from its start to its one ending: how it ended (ending.py), and what a launch is (launch.py).

`BoxProcess` (box/process.py) starts a box through the `Launch` its backend
makes (backends/registry.py): on the Docker engine (backends/docker/launch.py),
created or claimed warm from the pool, its events followed and its streams
attached; on an OCI runtime (backends/oci/launch.py), holding the streams
itself. Both report the box's end into one `Ends`, which makes it one `Ending`.
"""

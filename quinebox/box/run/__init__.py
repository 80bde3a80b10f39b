"""A box from its start to its one ending: how it ended (ending.py), and one launch per backend.

`BoxProcess` (box/process.py) starts a box through the `Launch` of the
backend chosen for it (launch.py): on the Docker engine (docker_launch.py),
created or claimed warm from the pool, its events followed and its streams
attached; on an OCI runtime (oci_launch.py), holding the streams itself. Both
report the box's end into one `Ends`, which makes it one `Ending`.
"""

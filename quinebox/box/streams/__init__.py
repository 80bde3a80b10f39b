"""A box's bytes: its stdin, stdout and stderr, and its terminal.

Holds the engine's multiplexed attach frames and the pumps that move bytes
(relay.py), streams handed straight to a box on an OCI runtime (direct.py), and
a terminal's master relayed (console.py). The engine's attach connection
relayed is the Docker backend's (backends/docker/attached.py, at this tier).

May import only the foundation modules: every other room of box/ moves bytes
through here.
"""

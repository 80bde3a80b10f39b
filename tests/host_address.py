"""An address of this host that is not loopback, where test servers listen for boxes.

A box reaches the host's loopback only as net:host-loopback:PORT, by that
name; a test that needs a server under a name of its own (a TLS host, an
approval's subject) listens here instead and is granted it by net:CIDR, as a
user grants a private service.
"""

import socket


def host_address() -> str:
    """The source address of this host's route outward (no packet is sent: connecting a UDP socket only picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))
        return probe.getsockname()[0]

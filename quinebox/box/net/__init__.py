"""A box's sockets to the host: its lifeline and model broker, and its egress.

Holds the host end of the box's socket (broker.py), the box's init reached
over its lifeline to start commands in the box (init_line.py), the egress proxy that
decides each outgoing connection (egress.py), taking the sockets the guest's
forwarder hands over (handover.py), the proxy's wire format (proxywire.py), and
secrets that exist only on the wire (secrets.py).

May import: audit (each egress decision is recorded and may be asked),
worlds.beneath, guest.protocol and the foundation modules.
"""

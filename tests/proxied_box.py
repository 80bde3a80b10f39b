"""A box's side of the host's egress proxy, for tests: connections the proxy serves, as if the box had handed them over."""

import socket
import threading

from quinebox.box.net.egress import Egress


class ProxiedBox:
    """An Egress whose lines (`said`) and records (`records`) are kept for the test to read."""

    def __init__(self, rules, **options):
        self.said, self.records = [], []
        self.egress = Egress(rules, say=self.said.append, record=self.records.append, **options)

    def connect(self) -> socket.socket:
        """The box's end of a new connection that the proxy serves on a thread of its own."""
        mine, theirs = socket.socketpair()
        reader = theirs.makefile("rb")

        def serve():
            try:
                self.egress.handle(theirs, reader)
            finally:
                reader.close()
                theirs.close()

        threading.Thread(target=serve, daemon=True).start()
        mine.settimeout(10)
        return mine

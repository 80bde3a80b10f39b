"""The agent's connection to the host: requests answered with a frame, or refused with the exit code to use.

Stdlib only: it runs inside boxes.
"""

import socket

TYPE_CHECKING = False  # typing's flag, without importing typing (start-up): mypy reads the guest as the package, a box runs it flat
if TYPE_CHECKING:
    from quinebox.guest import protocol
else:
    import protocol

HOST_SOCKET = "/run/quinebox/host.sock"


class Refused(Exception):
    """The host declined a request; it says which exit code ends the agent."""

    def __init__(self, message):
        super().__init__(message.get("message", "refused"))
        self.code = message.get("code", "refused")
        self.exit_code = int(message.get("exit_code", 1))


class Host:
    def __init__(self, cycle):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(HOST_SOCKET)
        self.reader = self.sock.makefile("rb")
        # `resume`: this agent goes on in a conversation the host hands it (a resumed session's), and counts its material
        self.welcome = self.request({"kind": "hello", "role": "agent", "cycle": cycle, "resume": True})

    def request(self, message):
        self.sock.sendall(protocol.encode(message))
        reply, _ = protocol.read_frame(self.reader)
        if reply["kind"] == "error":
            raise Refused(reply)
        return reply

    def event(self, **fields):
        self.sock.sendall(protocol.encode({"kind": "event", **fields}))

    def revise(self, turn, what, command=None):
        """Ask the host to keep a revision of /world; the note the model sees, if one was made."""
        try:
            reply = self.request({"kind": "revise", "turn": turn, "what": what, "command": command})
        except Refused as exc:
            return f"\n[world: no revision: {exc}]"
        return f"\n[world revision {reply['rev']}: {reply['paths']} path(s) changed]" if reply.get("new") else ""

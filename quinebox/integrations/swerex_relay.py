"""A host loopback port whose every connection reaches a port on a box's own loopback, through one exec in the box.

A box has no network but its own `lo`: nothing on the host can dial a port in it. A server in the box (SWE-ReX's
`swerex-remote`: swerex.py) listens on the box's 127.0.0.1; one exec in the box, a stdlib relay, reads frames on
its stdin and writes frames on its stdout, one connection of the box's server per connection to the host port.
One exec for the relay's whole life: a connection costs no exec, no Python start-up in the box.

Who may connect: the host port is on 127.0.0.1 only, and a connection whose socket (the kernel's table says whose)
is not this process's user's is closed before a byte reaches the box. What it carries is the server's to guard
too (swerex's token). Its own thread and event loop: SWE-agent calls SWE-ReX's runtime from a new `asyncio.run`
each time, so the relay cannot live in the loop that made it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
import threading
from collections import deque

from quinebox import PIPE, QuineboxError, Sandbox

__all__ = ["Relay"]

#: Frames on the relay exec's stdin and stdout: connection id, kind, length; then that many bytes.
FRAME = struct.Struct(">IBI")
OPEN, DATA, END = 0, 1, 2
#: The relay in the box: each OPEN a connection to the server's port, its bytes both ways as frames, END a half-close.
RELAY = """import socket,struct,sys,threading
P=int(sys.argv[1]);F=struct.Struct(">IBI");out=sys.stdout.buffer;inp=sys.stdin.buffer;lock=threading.Lock();socks={}
def say(i,k,b=b""):
    with lock:
        out.write(F.pack(i,k,len(b))+b);out.flush()
def pump(i,s):
    try:
        while True:
            b=s.recv(65536)
            if not b:break
            say(i,1,b)
    except OSError:pass
    say(i,2)
while True:
    h=inp.read(9)
    if len(h)<9:break
    i,k,n=F.unpack(h);b=inp.read(n) if n else b""
    if k==0:
        try:s=socket.create_connection(("127.0.0.1",P))
        except OSError:say(i,2);continue
        socks[i]=s;threading.Thread(target=pump,args=(i,s),daemon=True).start()
    elif k==1 and i in socks:
        try:socks[i].sendall(b)
        except OSError:pass
    elif k==2 and i in socks:
        try:socks.pop(i).shutdown(socket.SHUT_WR)
        except OSError:pass
"""


def peer_uid(peer_port: int, port: int) -> int | None:
    """The uid owning the loopback socket at 127.0.0.1:`peer_port` connected to our `port` (the kernel's table)."""
    want = (f"{peer_port:04X}", f"{port:04X}")
    with contextlib.suppress(OSError), open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            if (fields[1].split(":")[1], fields[2].split(":")[1]) == want:
                return int(fields[7])
    return None


class _Connection(asyncio.Protocol):
    """One connection of the runtime's on the host port, carried to the box as frames with its own id."""

    def __init__(self, relay: Relay):
        self.relay = relay
        self.id = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        host, peer, *_ = transport.get_extra_info("peername")
        if peer_uid(peer, self.relay.port) != os.geteuid():  # another user: closed before a byte reaches the box
            transport.abort()
            return
        self.transport = transport
        self.id = self.relay.open(self)

    def data_received(self, data: bytes) -> None:
        self.relay.send(self.id, DATA, data)

    def eof_received(self) -> bool:
        self.relay.send(self.id, END)
        return True  # half-closed: the answer may still come

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is not None:
            self.relay.lost(self.id)

    def pause_writing(self) -> None:
        self.relay.slow(self.id, True)

    def resume_writing(self) -> None:
        self.relay.slow(self.id, False)


class _BoxSide(asyncio.Protocol):
    """The relay exec's stdout: frames for the host's connections."""

    def __init__(self, relay: Relay):
        self.relay = relay
        self.buffer = bytearray()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while len(self.buffer) >= FRAME.size:
            ident, kind, length = FRAME.unpack_from(self.buffer)
            if len(self.buffer) < FRAME.size + length:
                break
            payload = bytes(self.buffer[FRAME.size:FRAME.size + length])
            del self.buffer[:FRAME.size + length]
            self.relay.from_box(ident, kind, payload)

    def connection_lost(self, exc: Exception | None) -> None:
        self.relay.box_gone()


class _BoxInput(asyncio.Protocol):
    """The relay exec's stdin: its flow control pauses the host's connections while the box is behind."""

    def __init__(self, relay: Relay):
        self.relay = relay

    def pause_writing(self) -> None:
        self.relay.host_reading(False)

    def resume_writing(self) -> None:
        self.relay.host_reading(True)


class Relay:
    """A host loopback port whose every connection reaches 127.0.0.1:`box_port` in the box, through one exec.

    Its own thread and event loop: SWE-agent calls the runtime from a new `asyncio.run` each time, so the relay
    cannot live in the loop that started the deployment."""

    def __init__(self, sandbox: Sandbox, python: str, box_port: int, *, timeout: float):
        self.said: deque[bytes] = deque(maxlen=16)  # the relay's stderr, its last chunks: why it ended, if it did
        self.exec = sandbox.Popen([python, "-I", "-S", "-c", RELAY, str(box_port)], stdin=PIPE, stdout=PIPE, stderr=self.said.append)
        self.port = 0
        self.failed: BaseException | None = None
        self._conns: dict[int, _Connection] = {}
        self._next = 0
        self._paused_hosts = False
        self._slow: set[int] = set()  # connections whose host reader is behind: the box's output waits for them
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"quinebox-swerex-relay-{sandbox.id}", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            self.failed = TimeoutError("the relay's port did not open")
        if self.failed is not None:
            self.close()
            raise QuineboxError(f"cannot relay to swerex-remote in box {sandbox.id}: {self.failed}")

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._server = self._loop.run_until_complete(self._loop.create_server(lambda: _Connection(self), "127.0.0.1", 0))
            self.port = self._server.sockets[0].getsockname()[1]
            self._out, _ = self._loop.run_until_complete(self._loop.connect_read_pipe(lambda: _BoxSide(self), self.exec.stdout))
            pipe, _ = self._loop.run_until_complete(self._loop.connect_write_pipe(lambda: _BoxInput(self), self.exec.stdin))
            self._in: asyncio.WriteTransport = pipe
        except (OSError, RuntimeError, ValueError) as exc:  # said by the constructor, which waits for this
            self.failed = exc
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()

    # -- in the relay's loop -----------------------------------------------------------------------

    def open(self, conn: _Connection) -> int:
        self._next += 1
        self._conns[self._next] = conn
        self.send(self._next, OPEN)
        if self._paused_hosts and conn.transport is not None:
            conn.transport.pause_reading()
        return self._next

    def send(self, ident: int, kind: int, data: bytes = b"") -> None:
        if not self._in.is_closing():
            self._in.write(FRAME.pack(ident, kind, len(data)) + data)

    def lost(self, ident: int) -> None:
        if self._conns.pop(ident, None) is not None:
            self.send(ident, END)
        self.slow(ident, False)  # a connection gone while behind must not hold the others

    def from_box(self, ident: int, kind: int, data: bytes) -> None:
        conn = self._conns.get(ident)
        if conn is None or conn.transport is None or conn.transport.is_closing():
            return
        if kind == DATA:
            conn.transport.write(data)
        elif kind == END:
            conn.transport.close()  # the server's side ended (swerex's server closes each connection after its answer)

    def box_gone(self) -> None:
        for conn in list(self._conns.values()):
            if conn.transport is not None:
                conn.transport.abort()
        self._conns.clear()

    def host_reading(self, on: bool) -> None:
        self._paused_hosts = not on
        for conn in self._conns.values():
            if conn.transport is not None and not conn.transport.is_closing():
                (conn.transport.resume_reading if on else conn.transport.pause_reading)()

    def slow(self, ident: int, behind: bool) -> None:
        """One connection's reader is behind (or caught up): the box's frames wait while any is."""
        was = bool(self._slow)
        (self._slow.add if behind else self._slow.discard)(ident)
        if was != bool(self._slow):
            (self._out.pause_reading if self._slow else self._out.resume_reading)()

    async def _shut(self) -> None:
        if getattr(self, "_server", None) is not None:
            self._server.close()
        self.box_gone()
        for name in ("_in", "_out"):
            if getattr(self, name, None) is not None:
                getattr(self, name).close()
        self._loop.call_soon(self._loop.stop)  # after the transports' own ends, which close their fds

    # -- from any thread -----------------------------------------------------------------------------

    def alive(self) -> bool:
        return self._thread.is_alive() and self.exec.poll() is None

    def close(self) -> None:
        """Close the port and every connection, end the exec (the box's end would too)."""
        if self._thread.is_alive():
            with contextlib.suppress(RuntimeError):  # its loop already stopped
                asyncio.run_coroutine_threadsafe(self._shut(), self._loop)
            self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()
        if self.exec.poll() is None:
            self.exec.kill()

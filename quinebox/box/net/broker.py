"""The host end of a box's socket: the box's lifeline and its only way to the model.

Identity is the socket: whatever arrives here is from this box, whatever it
claims. Each connection gets a thread that reads frames and answers them;
nothing a guest sends — garbage, oversized frames, unknown kinds — can do more
than earn an error frame and, when the stream cannot be trusted to continue,
a closed connection.

A box holds at most MAX_CONNECTIONS connections that carry no child of its
own; one that does (a spawn the tree started) is paid for by the box's spawn
budget, so an agent granted `spawn:100` may have its hundred children alive at
once. Past the cap the host stops accepting until one is done: the box's next
connect waits in the kernel's queue, never a connection reset under a spawn
the box was granted.

While this process lives, the box may live: the guest's init holds a
connection and kills the box when it breaks. The kernel closes our end however
we die, SIGKILL included.
"""

from __future__ import annotations

import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from quinebox import fdpass
from quinebox.box.net.init_line import InitLine
from quinebox.errors import QuineboxError
from quinebox.guest import protocol

ERROR_EXIT = 1
#: Connections one box may hold open at once that carry no child of its own (its spawn budget bounds those); past
#: it, the next is accepted only when one of them is done.
MAX_CONNECTIONS = 64
#: What a box's init answers the host's `drop` with (guest/checkpoints.py): it lets go of the lifeline, or keeps
#: it, naming what of the host's its processes hold.
LIFELINE_ANSWERS = ("dropping", "kept")
#: The host's word to a box's init that said its command died of SIGKILL (guest/init.py's `killed`): heard.
NOTED = {"kind": "noted"}


class Handler(Protocol):
    """What an agent's box may ask of the host. `None` for a box that runs no agent."""

    def welcome(self, hello: dict[str, Any]) -> dict[str, Any]: ...
    def chat(self, request: dict[str, Any]) -> dict[str, Any]: ...
    def event(self, event: dict[str, Any]) -> None: ...
    def revise(self, request: dict[str, Any]) -> dict[str, Any]: ...
    def restore_world(self, request: dict[str, Any]) -> Iterator[tuple[dict[str, Any], bytes]]: ...
    def adopt(self, request: dict[str, Any]) -> Iterator[tuple[dict[str, Any], bytes]]: ...
    def record_egress(self, facts: dict[str, Any]) -> None: ...


class Relay(Protocol):
    """A child box started over this connection; the connection then carries its streams."""

    def stdin(self, payload: bytes, eof: bool) -> None: ...
    def kill(self) -> None: ...
    def disconnected(self) -> None: ...


class Spawner(Protocol):
    """Starts child boxes for this box (its place in the tree). `None`: this box may not."""

    def spawn(self, request: dict[str, Any], channel: Channel) -> Relay: ...


class Channel:
    """One connection's sending side, shared by the thread that reads it and the child's stream threads."""

    def __init__(self, conn: socket.socket):
        self._conn = conn
        self._lock = threading.Lock()

    def send(self, message: dict[str, Any], payload: bytes = b"", fds: Sequence[int] = ()) -> bool:
        """One frame; `fds` go with its first bytes (one sendmsg), as guest/execs.py reads them."""
        try:
            frame = protocol.encode(message, payload)
            with self._lock:
                sent = socket.send_fds(self._conn, [frame], list(fds)) if fds else 0
                if sent < len(frame):  # (never a send of nothing: the box may have read it all and gone by then)
                    self._conn.sendall(frame[sent:])
            return True
        except (OSError, protocol.ProtocolError):
            return False


def error_frame(code: str, message: str, exit_code: int = ERROR_EXIT) -> dict[str, Any]:
    return {"kind": "error", "code": code, "message": message, "exit_code": exit_code}


def _serves_execs(message: dict[str, Any]) -> bool:
    """The hello of a box's init that starts execs (guest/lifeline.py); an agent that takes a warm box's lifeline
    over says a hello of its own on it, answered as any agent's."""
    serves = message.get("serves")
    return message["kind"] == "hello" and message.get("role") == "lifeline" and isinstance(serves, list) and "exec" in serves


def box_socket(path: str, *, backlog: int, owner: tuple[int, int] | None = None) -> socket.socket:
    """A listening Unix socket at `path` (a stale one there is replaced) that the box reaches by bind mount.

    `owner`: the host's (uid, gid) of the box's user (a root-made box's own ids, backends/oci/idmap.py): the socket
    is theirs alone (0600; root reaches it as root). Without one (a box whose user is ours) it is ours alone.
    The run dir (0700) keeps everyone else from its path; `box_peer` checks who connected on every accept.
    """
    # Only root gives a file away; a box made without root has its maker's ids.
    return fdpass.listen(path, mode=0o600, backlog=backlog, owner=owner if os.geteuid() == 0 else None)


def box_peer(conn: socket.socket, owner: tuple[int, int] | None) -> bool:
    """Whether the process at the other end of `conn` is the box's (its user's host uid) or the host's own (our
    uid, root's): anyone else that reached the socket (through a box's /proc/PID/root, say) is refused."""
    uid = fdpass.peer_uid(conn)
    return uid == os.geteuid() or uid == 0 or (owner is not None and uid == owner[0])


class Broker:
    def __init__(
        self, path: str, handler: Handler | None = None, spawner: Spawner | None = None, *, listener: socket.socket | None = None,
        owner: tuple[int, int] | None = None,
    ):
        """`listener`: the socket already listening at `path` (a warm box's, handed over when it was claimed).
        `owner`: the host's (uid, gid) of the box's user, who alone (and the host) may connect (box_socket)."""
        self.path = path
        self.owner = owner
        self.handler = handler
        self.spawner = spawner
        self._listener = listener or box_socket(path, backlog=16, owner=owner)
        self._connections: set[socket.socket] = set()
        #: Those of them that carry a child this box started (each paid for by its spawn budget).
        self._carrying = 0
        self._lock = threading.Lock()
        #: Told when a connection is done or starts carrying a child (room for the next), and when the broker closes.
        self._room = threading.Condition(self._lock)
        self._closed = False
        #: Connections served so far: only the first may be the init's (it connects before anything else runs).
        self._served = 0
        #: The box's init, once it has said so on the box's first connection (net/init_line.py).
        self.init: InitLine | None = None
        self.init_said = threading.Event()
        #: The lifeline asked (`ask_lifeline`), and where its answer goes.
        self._asked: socket.socket | None = None
        self._answers: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        #: Told the init's pid (the host's) when the init says its command died of SIGKILL, while the init waits for
        #: the broker's word: the box's cgroups stand until then (the Docker backend reads its OOM kills there).
        self.killed: Callable[[int], None] | None = None
        threading.Thread(target=self._accept, name=f"broker:{os.path.basename(path)}", daemon=True).start()

    def _accept(self) -> None:
        while True:
            with self._room:  # past the cap, the box's next connect waits in the listener's queue (and then in connect)
                self._room.wait_for(lambda: self._closed or not self._full())
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            if not box_peer(conn, self.owner):
                conn.close()
                continue
            if not self.adopt(conn) and self._closed:
                return

    def adopt(self, conn: socket.socket, *, init: bool = False) -> bool:
        """Serve a connection from this box: one accepted here, or a warm box's lifeline accepted before its claim
        (`init`: its init said then that it serves execs; the pool's keeper read its hello)."""
        with self._lock:
            if self._closed or self._full():
                conn.close()  # a box cannot make the host spend a thread per connection without bound
                return False
            self._connections.add(conn)
            first = self._served == 0
            self._served += 1
            channel = Channel(conn)  # one sending side, shared with the init's line: frames never interleave
            line = InitLine(channel) if init and first else None
            if line is not None:
                self.init = line
        if line is not None:
            self.init_said.set()
        threading.Thread(target=self._serve, args=(conn, channel, first, line), daemon=True).start()
        return True

    def _full(self) -> bool:
        """Whether the box holds MAX_CONNECTIONS connections that carry no child (the caller holds the lock)."""
        return len(self._connections) - self._carrying >= MAX_CONNECTIONS

    def _serve(self, conn: socket.socket, channel: Channel, first: bool, init: InitLine | None) -> None:
        reader = conn.makefile("rb")
        relay: Relay | None = None
        try:
            while True:
                try:
                    message, payload = protocol.read_frame(reader)
                except EOFError:
                    return
                except protocol.ProtocolError as exc:
                    channel.send(error_frame("protocol", str(exc)))
                    return
                if relay is not None:
                    self._relay(relay, message, payload, channel)
                    continue
                if init is not None and message["kind"] == "exec_exit":
                    init.exited(message)
                    continue
                if init is not None and message["kind"] == "killed":
                    if self.killed is not None:
                        self.killed(fdpass.peer_pid(conn))
                    channel.send(NOTED)
                    continue
                if first and self.init is None and _serves_execs(message):
                    init = self.init = InitLine(channel)
                if first:
                    self.init_said.set()  # the box's first connection has spoken: its init, or none that serves execs
                if message["kind"] in LIFELINE_ANSWERS:
                    if conn is self._asked:
                        self._answers.put(message)
                    continue
                if message["kind"] == "spawn":
                    relay = self._spawn(message, channel)
                    if relay is not None:
                        with self._room:  # the spawn budget pays for this one now: room for another
                            self._carrying += 1
                            self._room.notify_all()
                    continue
                if message["kind"] in ("restore_world", "adopt") and self.handler is not None:
                    stream = self.handler.restore_world if message["kind"] == "restore_world" else self.handler.adopt
                    try:
                        for frame, data in stream(message):
                            if not channel.send(frame, data):
                                return
                    except QuineboxError as exc:  # before its plan went out, or the stream is broken and the guest sees it end
                        channel.send(error_frame("host", str(exc), exc.exit_code))
                        return
                    continue
                reply = self._answer(message)
                if reply is not None:
                    channel.send(reply)
        except OSError:
            return
        finally:
            if relay is not None:
                relay.disconnected()
            if init is not None:
                init.lost()
            if first:
                self.init_said.set()
            reader.close()
            with self._room:
                self._connections.discard(conn)
                if relay is not None:
                    self._carrying -= 1
                self._room.notify_all()
            conn.close()

    def _spawn(self, message: dict[str, Any], channel: Channel) -> Relay | None:
        if self.spawner is None:
            channel.send(error_frame("refused", "this box may not start boxes", 125))
            return None
        try:
            return self.spawner.spawn(message, channel)
        except QuineboxError as exc:
            channel.send(error_frame("refused", str(exc), exc.exit_code))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            channel.send(error_frame("invalid", f"malformed spawn frame: {exc}", 125))
        return None

    @staticmethod
    def _relay(relay: Relay, message: dict[str, Any], payload: bytes, channel: Channel) -> None:
        kind = message["kind"]
        if kind == "stdin":
            relay.stdin(payload, bool(message.get("eof")))
        elif kind == "kill":
            relay.kill()
        else:
            channel.send(error_frame("unknown", f"{kind!r} is not a frame for a running child"))

    def _answer(self, message: dict[str, Any]) -> dict[str, Any] | None:
        kind = message["kind"]
        if kind == "hello" and message.get("role") == "lifeline":
            return None
        if self.handler is None:
            return error_frame("unsupported", f"this box has no agent runtime; {kind!r} is not served")
        try:
            if kind == "hello":
                return self.handler.welcome(message)
            if kind == "chat":
                return self.handler.chat(message)
            if kind == "event":
                self.handler.event(message)
                return None
            if kind == "revise":
                return self.handler.revise(message)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            return error_frame("invalid", f"malformed {kind} frame: {exc}")
        except QuineboxError as exc:  # the host could not do it (its state dir is full, say): the guest is told
            return error_frame("host", str(exc), exc.exit_code)
        return error_frame("unknown", f"unknown frame kind {kind!r}")

    def connections(self) -> int:
        """How many connections the box holds open to the host (its lifeline is one)."""
        with self._lock:
            return len(self._connections)

    def ask_lifeline(self, message: dict[str, Any], timeout: float) -> dict[str, Any] | None:
        """`message` to the box's init over its lifeline, and the init's answer (one of LIFELINE_ANSWERS); None when
        the box holds another connection besides (or none: then which is the lifeline cannot be told), or no answer
        came within `timeout` (an init of an older quinebox answers nothing)."""
        with self._lock:
            if len(self._connections) != 1:
                return None
            (self._asked,) = self._connections
        while not self._answers.empty():  # a late answer to an ask that gave up
            self._answers.get_nowait()
        try:
            self._asked.sendall(protocol.encode(message))
            return self._answers.get(timeout=timeout)
        except (OSError, queue.Empty):
            return None
        finally:
            self._asked = None

    def wait_unconnected(self, timeout: float) -> bool:
        """Whether the box holds no connection to the host within `timeout` (its init let go of the lifeline)."""
        until = time.monotonic() + timeout
        while self.connections():
            if time.monotonic() >= until:
                return False
            time.sleep(0.005)
        return True

    def close(self) -> None:
        """Drop every connection (a box still attached will kill itself) and remove the socket."""
        with self._room:
            self._closed = True
            connections = list(self._connections)
            self._room.notify_all()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

"""The material (the box's stdin) as the agent's tools read it on fd 3, and how much of it they have read.

A resumed session goes on from a turn it had asked before its process was lost, and its tools must read on
from where they were then; so the agent says, with each turn it asks, how many bytes of the material its tools
had read. A pipe holds no such count, nor does the engine's stream in front of it, so fd 3 is a pipe of the
agent's own, fed from the box's stdin by a process forked before anything else runs: what the tools have read
is what it wrote less what still waits in the pipe (FIONREAD), taken between two of its writes so the sum is
never torn. It lives as long as the agent, across exec (the agent hands its end of the asking socket on), and
leaves when that socket closes.

Stdlib only: it runs inside boxes.
"""

import fcntl
import os
import select
import socket
import sys
import termios

CHUNK = 1 << 16


def start(source, target):
    """Feed the file descriptor `source` into a pipe whose read end becomes `target`; the socket to `ask` on."""
    read_end, write_end = os.pipe()
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the feeder: it keeps only what it feeds with
        try:
            kept = sorted({source, read_end, write_end, theirs.fileno()})
            low = 0
            for fd in kept:
                os.closerange(low, fd)
                low = fd + 1
            os.closerange(low, os.sysconf("SC_OPEN_MAX"))
            feed(source, read_end, write_end, theirs)
        finally:
            os._exit(0)
    theirs.close()
    os.close(write_end)
    os.close(source)  # first: it may hold `target`'s number
    if read_end != target:
        os.dup2(read_end, target)
        os.close(read_end)
    return ours


def feed(source, read_end, write_end, asker):
    """Copy `source` into the pipe until it ends, answering each question on `asker` with the bytes read from the pipe."""
    os.set_blocking(write_end, False)
    written, pending, ended = 0, b"", False
    while True:
        readers = [asker] if pending or ended else [asker, source]
        ready, writable, _ = select.select(readers, [write_end] if pending else [], [])
        if asker in ready:
            if not asker.recv(64):
                return  # the agent is gone
            waiting = fcntl.ioctl(read_end, termios.FIONREAD, b"\0\0\0\0")
            asker.sendall(b"%d\n" % (written - int.from_bytes(waiting, sys.byteorder)))
        if source in ready:
            try:
                pending = os.read(source, CHUNK)
            except OSError:
                pending = b""
            if not pending:
                ended = True
                os.close(write_end)  # the tools read to its end, then see EOF
        if pending and write_end in writable:
            try:
                done = os.write(write_end, pending)
            except BlockingIOError:
                done = 0
            written += done
            pending = pending[done:]


def ask(sock):
    """How many bytes of the material the tools have read; None when the feeder cannot say."""
    if sock is None:
        return None
    try:
        sock.sendall(b"?")
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = sock.recv(64)
            if not chunk:
                return None
            reply += chunk
        return int(reply)
    except (OSError, ValueError):
        return None

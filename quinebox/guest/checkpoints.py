"""The box's init, around a checkpoint: it lets go of its connections to the host, and dials its lifeline again.

gVisor cannot carry a connection to the host through a checkpoint (this runsc's encoder fails on the socket its
gofer connected, and the sandbox dies of it), nor a file of the host's other than the box's own stdio through a
restore (the restore fails on the descriptor). So before a checkpoint the host sends `drop` over the lifeline, and
the init, as lifeline.py's main loop hands it that frame (`let_go`), unless it runs execs of its own (execs.py:
their stdin, stdout and stderr are the host's):

- looks for a file of the host's held by any process of the box (gVisor's /proc names one `host:[N]`) other than
  the box's own stdio, which a restore hands over anew: if there is one, it answers `kept`, naming each, and
  nothing changes (the host refuses the checkpoint in one line);
- else stops its egress forwarder (its listener closed, a connection being handed over let finish), answers
  `dropping` and closes the lifeline, which the host then sees end;
- and waits for SIGPWR (`Dropped.redialled`), which the host sends once the box goes on: the original after its
  checkpoint, each copy after its restore. Then it dials the lifeline again — a copy's mount of the host socket
  is the copy's own, so a copy reaches its own host — and starts its forwarder again. Had no SIGPWR come within
  REDIAL_WITHIN, it dials all the same: a host that is gone refuses, and the box ends as it would have.

Runs inside untrusted boxes: stdlib only, imported by the init only once the host sends it something.
"""

import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal

    from quinebox.guest import forwarder, protocol
else:
    import _signal as signal

    import forwarder
    import protocol

#: How often the init looks whether it was told to dial again, while it holds no lifeline.
POLL = 0.05
#: The longest the init goes without a lifeline before it dials all the same.
REDIAL_WITHIN = 30.0
#: What the host's signal to dial again is (one the init forwards to no command, and the kernel sends no box).
REDIAL = signal.SIGPWR

class Dropped:
    """The lifeline let go of: `redialled()` is the new one once the host said so (or the deadline passed).
    `dial()` is the init's own: the lifeline connected, or the box ended when the host is gone."""

    poll = POLL

    def __init__(self, forwarding, dial):
        self.forwarding = forwarding
        self.dial = dial
        self.told = False
        self.until = time.monotonic() + REDIAL_WITHIN
        signal.signal(REDIAL, self._told)

    def _told(self, _signum, _frame):
        self.told = True

    def redialled(self):
        """The lifeline dialled again, once told to; None while not yet. A host that is gone ends the box."""
        if not self.told and time.monotonic() < self.until:
            return None
        signal.signal(REDIAL, signal.SIG_IGN)
        line = self.dial()
        line.sendall(protocol.encode({"kind": "hello", "role": "lifeline"}))
        if self.forwarding is not None:
            self.forwarding = forwarder.start()
        return line


def let_go(line, forwarding, dial):
    """After the host's `drop`: a `Dropped` when nothing holds the host's files and the lifeline is let go of, else None
    (the lifeline is kept, and the host told why)."""
    held = host_files()
    if held:
        line.sendall(protocol.encode({"kind": "kept", "held": held}))
        return None
    if forwarding is not None:
        forwarder.stop(forwarding)
    dropped = Dropped(forwarding, dial)
    line.sendall(protocol.encode({"kind": "dropping"}))
    line.close()
    return dropped


def host_files():
    """Each process that holds a file of the host's, besides the box's own stdio (pid 1's fds 0-2): one line each. A
    process whose files cannot be looked at (another user's) is named too: nothing it holds can be vouched for."""
    own = set()
    for stdio in ("0", "1", "2"):
        try:
            own.add(os.readlink(f"/proc/1/fd/{stdio}"))
        except OSError:
            pass
    found = []
    for pid in sorted((p for p in os.listdir("/proc") if p.isdigit()), key=int):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except PermissionError:
            found.append(f"pid {pid} ({_command(pid)}) is another user's: its open files cannot be looked at")
            continue
        except OSError:
            continue  # gone meanwhile
        hosts = []
        for fd in sorted(fds, key=int):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("host:[") and target not in own:
                hosts.append(fd)
        if hosts:
            found.append(f"pid {pid} ({_command(pid)}) holds files of the host's as fd {', '.join(hosts)} (an exec's stdin, stdout or stderr)")
    return found


def _command(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read(200).replace(b"\0", b" ").decode(errors="replace").strip() or "?"
    except OSError:
        return "?"

"""What a snapshot of a long-lived box carries, what it refuses, and by which rule: pure, so a table says it all.

Carried, at one instant: the memory and the processes of the box, their open files, every tmpfs (/tmp, /dev/shm,
a scratch /world), its own /world (copied while nothing of the box runs), and its listening sockets and the
connections between its own processes. By rule:

- A connection to the outside (through the egress proxy) is reset: the box's forwarder hands nothing over while
  the instant is taken, and a copy's new connections go through its own proxy, with the same grants.
- The host socket (the lifeline) and the egress socket are re-attached: the box's init lets go of its lifeline
  before the instant and dials it again after, the original its own socket, each copy the copy's.
- A host path granted with rw: or ro: is the host's, not the box's: every copy mounts the same path.
- The world's files keep their bytes, modes and times; their owner is the box's user.
- A copy's processes keep their environment: QUINEBOX_SESSION there still names the original.

Refused, by name, before anything is stopped: a box on a backend that cannot checkpoint it here (runc, whose
CRIU fails on this kernel; the engine, without its experimental mode); a writable root (rootfs:rw); secret: grants (their placeholders and
the proxy's authority are the original session's alone); a /world that is a host directory (--world DIR: the
box works on yours, which a copy could not) or another box's copy-on-write view. Refused by what the box holds
at that instant (box/live/checkpoints.py): an exec running in it, a file of the host's held by one of its
processes (an exec's stdio a background process kept), a connection to the host besides its lifeline, a FIFO,
socket or device in its world.
"""

from __future__ import annotations

from dataclasses import dataclass

#: What a snapshot carries, as `box snapshots` and the docs say it.
CARRIED = ("memory", "processes", "open files", "every tmpfs (/tmp, /dev/shm)", "/world")
#: Where quinebox takes snapshots: runsc's checkpoint and restore.
SNAPSHOT_RUNTIME = "runsc"


@dataclass(frozen=True)
class Facts:
    """What decides whether a box can be snapshotted at all, whatever it holds at the instant."""

    session: str
    #: The box's backend as a person reads it (Box.label: "the Docker engine", "runc", "gVisor (runsc)").
    where: str
    #: The world's kind: "dir" (its own), "bind" (--world DIR), "overlay" (another's, copy-on-write), None (a tmpfs).
    world: str | None
    secrets: bool = False
    #: Why its backend cannot checkpoint it, as the backend says it (Box.why_not); None: it can (gVisor).
    cannot: str | None = None
    #: A root of its own the box may write (`rootfs:rw`): its layer is the host's tmpfs, which gVisor's image leaves out.
    writable_root: bool = False


def refusal(facts: Facts) -> str | None:
    """Why the box cannot be snapshotted, in one line; None when it can (what it holds is looked at then)."""
    box = f"box {facts.session}"
    if facts.cannot is not None:
        return f"{box} runs on {facts.where}, {facts.cannot}; make the box with --runtime {SNAPSHOT_RUNTIME} (gVisor) to snapshot it"
    if facts.writable_root:
        return f"{box} holds rootfs:rw: what it wrote to its root is in a layer of its own on the host, which a snapshot cannot carry"
    if facts.secrets:
        return f"{box} holds secret: grants, whose placeholders and proxy authority are its own session's: a snapshot cannot carry them"
    if facts.world == "bind":
        return f"{box} works on a directory of yours as its /world (--world DIR), which a copy of it could not: give it a world of its own (--world-from) to snapshot it"
    if facts.world == "overlay":
        return f"{box}'s /world is a copy-on-write view of another box's world, which a snapshot cannot carry"
    return None


def held_refusal(session: str, held: list[str]) -> str:
    """The one line for what the box's init found held of the host's (guest/checkpoints.py's `kept`)."""
    more = f" (and {len(held) - 2} more)" if len(held) > 2 else ""
    return (f"box {session} cannot be snapshotted now: gVisor restores no file of the host's but the box's own stdio, and "
            f"{'; '.join(held[:2])}{more}: end it, or start it with its output inside the box (`cmd > /tmp/log 2>&1 < /dev/null &`)")


def links_refusal(session: str, count: int) -> str:
    """The one line for connections to the host open besides the lifeline (a child box's streams, say)."""
    return (f"box {session} cannot be snapshotted now: {count} connection(s) from inside it to the host are open (a child "
            "box's streams, or a program using /run/quinebox/*.sock), which gVisor cannot carry; try again once they end")


def world_refusal(session: str, specials: list[str]) -> str:
    """The one line for what of the world a snapshot cannot copy."""
    more = f" (and {len(specials) - 3} more)" if len(specials) > 3 else ""
    return f"box {session} cannot be snapshotted now: its world holds {', '.join(specials[:3])}{more}, which a snapshot cannot copy; remove it first"

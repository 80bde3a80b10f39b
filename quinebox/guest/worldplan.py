"""Carrying out the host's plans for /world in the box: rolling back to a revision, adopting a child's changes.

The host decides what the world should become and streams the plan and the
files' bytes; the guest writes them, so the box's overlay sees every write.
Stdlib only: it runs inside boxes.
"""

import os
import stat

TYPE_CHECKING = False  # typing's flag, without importing typing (start-up): mypy reads the guest as the package, a box runs it flat
if TYPE_CHECKING:
    from quinebox.guest import protocol
else:
    import protocol

WORLD = "/world"
NODES = {"p": stat.S_IFIFO, "s": stat.S_IFSOCK}


def clear(path):
    """Remove whatever is at path, a directory with everything in it; never follows a symlink.
    A box may have locked itself out of its own directories (mode 000): they are opened up first."""
    import shutil

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return
    try:
        shutil.rmtree(path)
    except PermissionError:
        open_up(path)
        shutil.rmtree(path)


def open_up(top):
    """Give the owner every right on each directory below `top` (they are all the box's own)."""
    stack = [top]
    while stack:
        path = stack.pop()
        os.chmod(path, stat.S_IMODE(os.lstat(path).st_mode) | 0o700)
        with os.scandir(path) as entries:
            stack.extend(e.path for e in entries if e.is_dir(follow_symlinks=False))


class Incoming:
    """The files' bytes that follow a world plan, one file after another, as they arrive:
    a file is written chunk by chunk, never held whole."""

    def __init__(self, reader):
        self.reader = reader
        self.pending = bytearray()
        self.left = 0  # bytes of the current file not yet taken

    def chunks(self):
        while self.left:
            if not self.pending:
                frame, payload = protocol.read_frame(self.reader)
                if frame["kind"] != "world_data":
                    raise protocol.ProtocolError(f"expected world data, got {frame['kind']!r}")
                self.pending.extend(payload)
            size = min(self.left, len(self.pending))
            chunk = bytes(self.pending[:size])
            del self.pending[:size]
            self.left -= size
            yield chunk


def apply_plan(host, request):
    """Ask the host for a plan for /world and carry it out; (the plan or an error text, what failed)."""
    host.sock.sendall(protocol.encode(request))
    plan, _ = protocol.read_frame(host.reader)
    if plan["kind"] == "error":
        return f"error: {plan.get('message')}", []
    failed = []
    incoming = Incoming(host.reader)
    #: Directories above a step that the box had locked itself out of (mode 000, say): their modes, put back at the end.
    loosened = {}

    def reach(rel):
        parts = rel.split("/")[:-1]
        for depth in range(len(parts) + 1):
            above = "/".join(parts[:depth]) or "."
            path = os.path.join(WORLD, above)
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode) and above not in loosened and not os.access(path, os.W_OK | os.X_OK):
                loosened[above] = stat.S_IMODE(st.st_mode)
                os.chmod(path, loosened[above] | 0o700)

    def attempt(action, rel, *args):
        for again in (False, True):
            try:
                action(os.path.join(WORLD, rel), *args)
                return
            except PermissionError as exc:
                if not again:
                    try:
                        reach(rel)
                        continue
                    except OSError:
                        pass
                failed.append(f"{rel}: {exc.strerror or exc}")
            except OSError as exc:
                failed.append(f"{rel}: {exc.strerror or exc}")
                return

    def make_dir(path, mode):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            st = None
        if st is not None and not stat.S_ISDIR(st.st_mode):
            clear(path)
            st = None
        if st is None:
            os.makedirs(path, exist_ok=True)
        os.chmod(path, 0o700 | mode)

    def make_link(path, target):
        clear(path)
        os.symlink(target, path)

    def make_node(path, kind, mode):
        clear(path)
        os.mknod(path, NODES[kind] | 0o600)
        os.chmod(path, mode)

    def write(path, mode, mtime):
        clear(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as out:
            for chunk in incoming.chunks():
                out.write(chunk)
            os.fchmod(out.fileno(), mode)
        if mtime:
            os.utime(path, ns=(mtime, mtime), follow_symlinks=False)

    for rel in plan["remove"]:
        attempt(clear, rel)
    for rel, mode in plan["dirs"]:
        attempt(make_dir, rel, mode)
    for rel, target in plan["links"]:
        attempt(make_link, rel, target)
    for rel, kind, mode in plan["nodes"]:
        if kind in NODES:
            attempt(make_node, rel, kind, mode)
    for rel, mode, size, mtime in plan["files"]:
        incoming.left = size
        attempt(write, rel, mode, mtime)
        for _ in incoming.chunks():  # what a failed write did not take: the stream goes on
            pass
    # Last, deepest first: the plan's directory modes, then those of the directories opened up on the way.
    modes = dict(plan["dirs"])
    for rel, mode in loosened.items():
        modes.setdefault(rel, mode)
    for rel in sorted(modes, key=lambda r: -r.count("/")):
        attempt(os.chmod, rel, modes[rel])
    failed.extend(plan["lost"])
    return plan, failed


def listed(label, items, limit=50):
    return f"{label}: " + "; ".join(items[:limit]) + (f"; and {len(items) - limit} more" if len(items) > limit else "")


def restore_world(host, revision):
    """Roll /world back; the tool result, saying what was undone (the host checks the revision)."""
    plan, failed = apply_plan(host, {"kind": "restore_world", "revision": revision})
    if isinstance(plan, str):
        return plan
    undone = plan.get("undone") or []
    lines = [f"/world is back at revision {revision}; your conversation is unchanged."]
    lines.append(listed("Undone", undone) if undone else "Nothing had changed since then.")
    lines.append(f"The world as it was just before this restore is revision {plan['before']}.")
    if failed:
        lines.append(listed("Could not restore", failed, 20))
    return "\n".join(lines)


def adopt_world(host, session):
    """Bring a finished child's changes into /world; a line for the fork's result."""
    plan, failed = apply_plan(host, {"kind": "adopt", "session": session})
    if isinstance(plan, str):
        return plan
    text = listed(f"adopted {session}'s world", plan.get("adopted") or []) if plan.get("adopted") else f"{session} changed nothing in its world"
    return text + (("; " + listed("could not write", failed, 20)) if failed else "")

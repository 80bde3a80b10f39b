"""The MCP tools on a box's time: pause and resume it, checkpoint it, restore a snapshot, fork it into copies.

A snapshot a client makes is this server's, as its boxes are: restore_sandbox takes only those (each copy holds
the grants its box was made with, within this server's), a copy or a fork's copy is a box of this server's
(counted against its most, reaching the same files as its original), and the snapshots this server made are
removed at its end. Checkpoints are taken on gVisor (a server run with --runtime runsc); elsewhere each tool
says in one line why not.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from quinebox.integrations.mcp_boxes import Boxes, look
from quinebox.integrations.mcp_checks import DEFAULT_TTL, MAX_TTL, Refused, lifetime, text

#: The most copies one fork_sandbox makes.
MAX_COPIES = 8


class SnapshotTools(Boxes):
    """pause_sandbox, resume_sandbox, checkpoint_sandbox, restore_sandbox, fork_sandbox, list_snapshots, remove_snapshot."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        #: The snapshots this server made, and the files each one's box reached.
        self.snapshots: dict[str, Any] = {}
        self.snapshot_roots: dict[str, list[str]] = {}
        self.snapshot_lock = threading.Lock()

    def pause_sandbox(self, box: str) -> dict[str, Any]:
        """Stop every process of a box where it is; its ttl stands still, and exec into it is refused until resume_sandbox."""
        sb = self.box(box)
        sb.pause()
        return {"box": sb.id, "paused": True, "look": look(sb.id)}

    def resume_sandbox(self, box: str) -> dict[str, Any]:
        """Let every process of a paused box go on."""
        sb = self.box(box)
        sb.resume()
        return {"box": sb.id, "paused": False, "look": look(sb.id)}

    def checkpoint_sandbox(self, box: str) -> dict[str, Any]:
        """Snapshot a box (on gVisor): its memory, processes, open files, /tmp and /world at one instant; the box goes on.
        restore_sandbox makes a new live box from the snapshot."""
        sb = self.box(box)
        made = sb.checkpoint()
        with self.snapshot_lock:
            self.snapshots[made.id] = made
            self.snapshot_roots[made.id] = list(self.roots[sb.id])
        return {"snapshot": made.id, "box": sb.id, "bytes": made.size}

    def restore_sandbox(self, snapshot: str, ttl: float | str | None = None, name: str | None = None) -> dict[str, Any]:
        """A new live box from a snapshot this server made: a new id, its processes going on from the snapshot's instant,
        a world of its own. ttl: seconds or a duration (default 1h)."""
        from quinebox import Sandbox

        made = self._snapshot(snapshot)
        seconds = lifetime(self.ceiling, ttl, "ttl", DEFAULT_TTL, MAX_TTL)
        with self._making(1):
            sb = Sandbox.restore(made.id, ttl=seconds, name=text(name, "name", 63) if name is not None else None)
        self._adopt(sb, made.id)
        return {"box": sb.id, "name": sb.name, "from": made.id, "ttl_s": seconds, "files": self.roots[sb.id], "look": look(sb.id)}

    def fork_sandbox(self, box: str, copies: int = 2) -> dict[str, Any]:
        """copies (1 to 8) live copies of a box from one instant, each with a world of its own; the box goes on."""
        sb = self.box(box)
        if isinstance(copies, bool) or not isinstance(copies, int) or not 1 <= copies <= MAX_COPIES:
            raise Refused(f"copies is a whole number from 1 to {MAX_COPIES}")
        with self._making(copies):
            made = sb.fork(copies)
        for copy in made:
            with self.lock:
                self.boxes[copy.id] = copy
                self.roots[copy.id] = list(self.roots[sb.id])
        return {"box": sb.id, "copies": [copy.id for copy in made], "look": look(sb.id)}

    def list_snapshots(self) -> dict[str, Any]:
        """The snapshots this server made: id, the box it was of, its size."""
        with self.snapshot_lock:
            found = list(self.snapshots.values())
        return {"snapshots": [{"snapshot": s.id, "box": s.box, "bytes": s.size, "created": s.created} for s in found]}

    def remove_snapshot(self, snapshot: str) -> dict[str, Any]:
        """Remove a snapshot this server made."""
        from quinebox.box.live import snapshots

        made = self._snapshot(snapshot)
        with self.snapshot_lock:
            self.snapshots.pop(made.id, None)
        snapshots.remove(made)
        return {"snapshot": made.id, "removed": True}

    # -- helpers ---------------------------------------------------------------------------

    def _snapshot(self, ref: Any) -> Any:
        ref = text(ref, "snapshot", 64)
        with self.snapshot_lock:
            found = [s for key, s in self.snapshots.items() if key == ref or key.startswith(ref)]
        if len(found) != 1 or not ref:
            raise Refused(f"no snapshot {ref!r} made by this server: list_snapshots lists them")
        return found[0]

    @contextlib.contextmanager
    def _making(self, count: int) -> Iterator[None]:
        """Room for `count` more boxes, held while they start."""
        with self.lock:
            if len(self.boxes) + self.starting + count > self.max_boxes:
                raise Refused(f"this server holds {len(self.boxes)} boxes of its most {self.max_boxes}: remove_sandbox some first")
            self.starting += count
        try:
            yield
        finally:
            with self.lock:
                self.starting -= count

    def _adopt(self, sb: Any, snapshot: str) -> None:
        with self.lock:
            self.boxes[sb.id] = sb
            self.roots[sb.id] = list(self.snapshot_roots[snapshot])

    def close(self) -> None:
        """Remove every box this server made, then its snapshots."""
        from quinebox.box.live import snapshots

        super().close()
        with self.snapshot_lock:
            made, self.snapshots = list(self.snapshots.values()), {}
        for snapshot in made:
            try:
                snapshots.remove(snapshot)
            except OSError:
                pass

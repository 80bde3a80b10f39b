"""One box on an OCI runtime as its runtime's `list` shows it: a Box (boxes.py) that owns its runtime, id and bundle.

Whoever lists the boxes (ps, kill, gc, `exec --in`) sees these; the process that made a box holds its OciBox
(ocibox.py), which ends the same way: kill through the runtime, and removal through boxroot.remove_box.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from quinebox.box.backends.boxes import Box
from quinebox.box.backends.boxroot import IMAGE_ROOT, bundle_of, remove_box
from quinebox.box.backends.oci import Runtime, made_as
from quinebox.box.backends.ocibox import oci_runtime
from quinebox.box.policy import LABEL_SESSION
from quinebox.errors import EngineError
from quinebox.state import state_dir


class RuntimeBox(Box):
    """A container of quinebox's on `runtime`; its bundle is found from its session (boxroot.bundle_of)."""

    def __init__(self, runtime: Runtime, cid: str, labels: Mapping[str, str], *, state: str = "?", command: str = "", image_root: str = "", made: float = 0.0):
        self.runtime = runtime
        self.id = cid
        self.labels = labels
        self.backend = runtime.name
        self.state = state
        self.command = command
        self.image_root = image_root
        self.made = made

    @property
    def made_as(self) -> str:
        """The session the box was made as, which names its bundle and cgroup (a claimed warm box's is its own)."""
        return made_as(self.id)

    @property
    def bundle(self) -> Path:
        return bundle_of(self.made_as)

    def kill(self, signal: str = "KILL") -> bool:
        return self.runtime.kill(self.id, signal)

    def destroy(self) -> bool:
        return remove_box(self.runtime.argv(), self.id, self.bundle)

    def process(self) -> tuple[str, str]:
        """From its bundle's config: the runtime's own state has no process in it."""
        try:
            process = json.loads((self.bundle / "config.json").read_text())["process"]
            return f"{process['user']['uid']}:{process['user']['gid']}", process.get("cwd") or "/"
        except (OSError, ValueError, KeyError, TypeError):
            raise EngineError(f"box {self.session} is going away: its bundle is gone") from None

    def id_ranges(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]] | None:
        """The uids and gids its user namespace maps, each as (first id in the box, count), from its bundle's
        config; None when it has none (a gVisor box: its ids are its sandbox's)."""
        try:
            linux = json.loads((self.bundle / "config.json").read_text())["linux"]
            if "uidMappings" not in linux:
                return None
            uids, gids = ([(int(m["containerID"]), int(m["size"])) for m in linux[key]] for key in ("uidMappings", "gidMappings"))
            return uids, gids
        except (OSError, ValueError, KeyError, TypeError):
            raise EngineError(f"box {self.session} is going away: its bundle is gone") from None


def runtime_boxes() -> list[RuntimeBox]:
    """quinebox's boxes on every OCI runtime this state dir has used (a runtime no longer installed, or not
    answering, is skipped: `gc` tries again later)."""
    found = []
    roots = state_dir() / "oci"
    for root in sorted(roots.iterdir()) if roots.is_dir() else ():
        if not root.is_dir():
            continue
        try:
            runtime = oci_runtime(root.name)
            listed = runtime.containers()
        except EngineError:
            continue
        for entry in listed:
            labels = entry.get("annotations") or {}
            if LABEL_SESSION not in labels:
                continue
            try:
                args = json.loads(Path(entry.get("bundle", ""), "config.json").read_text())["process"]["args"]
            except (OSError, ValueError, KeyError):
                args = []
            found.append(RuntimeBox(
                runtime, entry["id"], labels, state=entry.get("status", "?"), command=" ".join(args),
                image_root=labels.get(IMAGE_ROOT) or entry.get("rootfs", ""),
            ))
    return found


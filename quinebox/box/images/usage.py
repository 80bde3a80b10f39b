"""When a box last used each unpacked image, so that `gc` and `prune` let go of those no box has used for
`retention: {images: 30d}` (config.yaml), as they let go of those whose image is gone (eviction.py).

    images/<id>/used    touched as each box takes the image's root (its mtime is the last use); an image
                        never used since this began counts from its unpack

The marker is beside rootfs/, never in it: the seal (seal.py) covers the tree alone.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from quinebox.documents import load_config
from quinebox.errors import QuineboxError
from quinebox.grants import parse_duration

USED = "used"


def mark(root: str) -> str:
    """As a box takes `root` (an unpacked image's rootfs/): its image was used now. One utime; a cache this user
    cannot write (the shared one root fills) is not marked. Returns `root`."""
    used = os.path.join(os.path.dirname(root), USED)
    try:
        os.utime(used)
    except FileNotFoundError:
        try:
            os.close(os.open(used, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
        except OSError:
            pass
    except OSError:
        pass
    return root


def last_used(image_dir: Path) -> float:
    for path in (image_dir / USED, image_dir):
        try:
            return path.stat().st_mtime
        except FileNotFoundError:
            continue
    return time.time()


def idle_limit() -> float | None:
    """`retention: {images: DURATION}` in config.yaml, in seconds; None when it is not set."""
    retention = load_config().get("retention")
    if not isinstance(retention, dict) or "images" not in retention:
        return None
    try:
        return parse_duration(str(retention["images"]))
    except QuineboxError as exc:
        raise QuineboxError(f"bad `retention: {{images:}}` in config.yaml: {exc}") from None


def unused(root: Path, idle: float, in_use: set[str], now: float | None = None) -> list[Path]:
    """The unpacked images under `root` that no live box uses (`in_use`: directory names) and that no box has
    taken for `idle` seconds."""
    now = time.time() if now is None else now
    try:
        dirs = sorted(p for p in root.iterdir() if len(p.name) == 64 and (p / "rootfs").is_dir())
    except FileNotFoundError:
        return []
    return [p for p in dirs if p.name not in in_use and now - last_used(p) >= idle]

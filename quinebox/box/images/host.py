"""`--image host`: the host's own root as a box's image, for the developer's own tools.

Nothing is unpacked: the box's root is the host's `/` under the box's own overlay (backends/oci/boxroot.py), read-only
in the box. What the box may see of it is policy_host.py's to say; this reads what that rule is about (what the
host's root and /etc hold, when the box is made) and keeps the empty file it binds over what it hides.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from quinebox.box.policy import BoxMount, image_arch, native_arch
from quinebox.box.policy_host import ETC_SECRETS, SSH_DIR, host_view
from quinebox.box.spec import HOST_IMAGE, ImageInfo
from quinebox.state import run_dir

ROOT = "/"


def host_image() -> ImageInfo:
    """The host as an image: no environment, entrypoint or working directory of its own, this machine's arch."""
    return ImageInfo(name=HOST_IMAGE, id=HOST_IMAGE, arch=image_arch(native_arch()))


def hidden_mounts(*, rootless: bool = False) -> list[BoxMount]:
    """The mounts that hide from a box of the host what it is not shown (policy_host.host_view), for this host now;
    `rootless`: with the directories it is shown bound in too (its root is empty)."""
    with os.scandir(ROOT) as entries:
        top = [(entry.name, _kind(entry.path, follow=False)) for entry in entries]
    candidates = list(ETC_SECRETS)
    try:
        candidates += [os.path.join(SSH_DIR, name) for name in os.listdir(SSH_DIR)]
    except OSError:
        pass
    etc = [(path, kind) for path in candidates if (kind := _kind(path, follow=True)) is not None]
    return host_view([(name, kind) for name, kind in top if kind is not None], etc, str(_empty_file()), shown=rootless)


def _kind(path: str, *, follow: bool) -> str | None:
    """"dir", "file" or "link" (a link not followed, or leading nowhere); None when `path` does not exist."""
    try:
        info = os.stat(path) if follow else os.lstat(path)
    except FileNotFoundError:
        return "link" if follow and os.path.islink(path) else None
    except OSError:
        return "file"  # there, but not ours to look at: hidden as a file is (an empty one bound over it)
    return "link" if stat.S_ISLNK(info.st_mode) else "dir" if stat.S_ISDIR(info.st_mode) else "file"


def _empty_file() -> Path:
    """An empty read-only file of this user's, made once; bound read-only over every file a box is not shown."""
    path = run_dir() / "empty"
    if not path.is_file() or path.stat().st_size:
        fd, made = tempfile.mkstemp(dir=path.parent, prefix=".empty-")
        os.fchmod(fd, 0o444)
        os.close(fd)
        os.replace(made, path)
    return path

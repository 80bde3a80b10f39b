"""A bwrap box's read-only root, made of the image's unpacked tree without writing a byte of it (no overlay).

bwrap makes a mount point wherever it mounts, and the image cache is shared by every box: so nothing is mounted
into the image's own directories unless the point is already there. When the image has every top-level point the
box mounts on (the agent image ships /proc, /dev, /tmp, /world, /.quinebox and /run/quinebox), the root is the
image's tree bound read-only at / in one mount (`--ro-bind IMAGE /`). Otherwise it is a small tmpfs (`--tmpfs /`),
each top-level entry of the image bound back read-only (`--ro-bind`) or recreated (`--symlink`, as written: the
box resolves /bin -> usr/bin as the image does), the points it lacks made on it. Deeper, an image directory that
lacks a point becomes a tmpfs of its own whose entries are bound back the same way (a grant at /opt/tool/bin in an
image with /opt but no /opt/tool: /opt is a tmpfs, each of the image's /opt/* bound into it, /opt/tool made on it).
Each tmpfs made here is made read-only once the box's mounts are made (`root_seal`), as `--remount-ro` is one
mount's, not its children's. Each mount is CPU of every box's start (bwrap reads its mount table again for each
bind), which is why the one bind is taken wherever the image allows it.

`image_look(image_root)` is the one look at the host (lstat under the image's tree, never following a link: a
link is what the image says, resolved only inside the box); `root_argv`/`root_seal` are pure over it, so a table
test holds them with a look of its own. A mount point reached through one of the image's links (/var/run/x
with /var/run -> /run) would have bwrap follow the link on the host's side while it sets up: refused, one line.
"""

from __future__ import annotations

import functools
import os
import stat
from collections.abc import Iterable
from typing import Literal, Protocol

from quinebox.errors import ErrorKind, QuineboxError

Kind = Literal["dir", "file", "link"]
#: The root's tmpfs and each directory's made here hold only mount points and links: a few KiB; read-only once made.
ROOT_TMPFS = 1 << 20


class Look(Protocol):
    """What the image has at an absolute path, as the box would see it before any mount: "dir", "file" (anything
    else that is not a link: a file, a device node, a fifo), "link" or None; `entries` a directory's names,
    `target` a link's target as written, `mode` a directory's permission bits."""

    def __call__(self, path: str) -> Kind | None: ...

    def entries(self, path: str) -> tuple[str, ...]: ...

    def target(self, path: str) -> str: ...

    def mode(self, path: str) -> int: ...


class ImageLook:
    """`Look` over an unpacked image at `image_root`, from lstat (never following a link out of the tree), each
    answer cached: an image's tree never changes once unpacked."""

    def __init__(self, image_root: str) -> None:
        self.image_root = os.path.abspath(image_root)

    def _host(self, path: str) -> str:
        return os.path.join(self.image_root, os.path.normpath(path).lstrip("/"))

    @functools.lru_cache(maxsize=4096)  # noqa: B019 (one per image, kept for the process: image_look caches them)
    def _lstat(self, path: str) -> os.stat_result | None:
        parent = os.path.dirname(path)
        if parent != path and self(parent) != "dir":  # through a link or a file: not in the tree as said
            return None
        try:
            return os.lstat(self._host(path))
        except OSError:
            return None

    def __call__(self, path: str) -> Kind | None:
        path = os.path.normpath(path)
        if path == "/":
            return "dir"
        st = self._lstat(path)
        if st is None:
            return None
        return "link" if stat.S_ISLNK(st.st_mode) else "dir" if stat.S_ISDIR(st.st_mode) else "file"

    @functools.lru_cache(maxsize=1024)  # noqa: B019
    def entries(self, path: str) -> tuple[str, ...]:
        return tuple(sorted(os.listdir(self._host(path))))

    def target(self, path: str) -> str:
        return os.readlink(self._host(path))

    def mode(self, path: str) -> int:
        st = os.lstat(self._host(path))
        return stat.S_IMODE(st.st_mode)


@functools.lru_cache(maxsize=64)
def image_look(image_root: str) -> ImageLook:
    """The look at one unpacked image, one per image for the process (its answers are cached with it)."""
    return ImageLook(image_root)


def _norm(path: str) -> str:
    return os.path.normpath("/" + path.lstrip("/"))


def _parents(path: str) -> list[str]:
    """Every proper ancestor of an absolute path but /, shallowest first."""
    parts = path.strip("/").split("/")
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts))]


def _points(look: Look, mount_dests: Iterable[str]) -> tuple[frozenset[str], frozenset[str]]:
    """(what of the image is left out, the image directories to make tmpfs). A destination under another is not the
    image's (it lands on that mount); one the image has as a file or directory is mounted onto, the image's entry
    left out otherwise; where the image lacks a directory on the way (or has a file there), the nearest directory
    above becomes a tmpfs and that entry is left out, so bwrap makes the rest on the tmpfs. A link on the way is
    refused."""
    dests = {_norm(d) for d in mount_dests}
    points = {d for d in dests if d != "/" and not any(p in dests for p in _parents(d))}
    left, tmpfs = set(points), set()
    for dest in points:
        for parent in _parents(dest):
            kind = look(parent)
            if kind == "link":
                raise QuineboxError(
                    f"refused on bwrap: the mount at {dest} passes through the image's link {parent}; mount at the path it points to",
                    kind=ErrorKind.UNSUPPORTED, backend="bwrap", mount=dest, link=parent)
            if kind != "dir":
                tmpfs.add(os.path.dirname(parent))
                left.add(parent)
                break
        else:
            if look(dest) in (None, "link"):
                tmpfs.add(os.path.dirname(dest))
    return frozenset(left), frozenset(tmpfs)


def _show(image_root: str, look: Look, path: str, left: frozenset[str], tmpfs: frozenset[str]) -> list[str]:
    """`path` of the image as the box sees it: what is left out nothing (a mount lands there); a link a link; an
    image directory that becomes a tmpfs the tmpfs, then each of its entries the same way; any other file or
    directory bound read-only, then the tmpfs made below it (their parents are the image's own directories)."""
    kind = look(path)
    if path in left or kind is None:
        return []
    if kind == "link":
        return ["--symlink", look.target(path), path]
    if path in tmpfs:
        made = ["--size", str(ROOT_TMPFS), "--perms", f"{look.mode(path):04o}", "--tmpfs", path]
        for name in look.entries(path):
            made += _show(image_root, look, os.path.join(path, name), left, tmpfs)
        return made
    made = ["--ro-bind", image_root if path == "/" else os.path.join(image_root, path.lstrip("/")), path]
    under = path.rstrip("/") + "/"
    for below in sorted(t for t in tmpfs if t.startswith(under) and not any(u in tmpfs for u in _parents(t) if u.startswith(under))):
        made += _show(image_root, look, below, left, tmpfs)
    return made


def root_argv(image_root: str, look: Look, mount_dests: Iterable[str]) -> list[str]:
    """bwrap's options that make the box's root out of the image at `image_root` (module docstring), before the
    box's mounts at `mount_dests` (every destination bwrap mounts: /proc and /dev too); `root_seal` after them."""
    left, tmpfs = _points(look, mount_dests)
    if "/" not in tmpfs:  # every top-level point is the image's own: its tree at / in one read-only bind
        return _show(image_root, look, "/", left, tmpfs)
    argv = ["--size", str(ROOT_TMPFS), "--perms", "0755", "--tmpfs", "/"]
    for name in look.entries("/"):
        argv += _show(image_root, look, "/" + name, left, tmpfs)
    return argv


def root_seal(look: Look, mount_dests: Iterable[str]) -> list[str]:
    """What makes the root read-only once the box's mounts are made: each tmpfs `root_argv` made, deepest first, / last
    (the image's tree bound at / is read-only as bound)."""
    _, tmpfs = _points(look, mount_dests)
    return [arg for path in sorted(tmpfs, key=lambda p: (-p.count("/") if p != "/" else 1, p)) for arg in ("--remount-ro", path)]

"""The machine's shared image cache: unpacked images root's setup leaves for every user, read-only to them.

A user who is not root may have no engine to ask (its socket is root's in all but name) and cannot build
quinebox's own image (debootstrap needs root), so `quinebox image share NAME`, run by root (scripts/setup.sh
does), copies an image's unpacked tree from root's own cache into

    $QUINEBOX_SHARED_IMAGES (default /var/lib/quinebox/images)
      <hex of the image id>/rootfs/ and image.json    as in the state dir's images/ (rootfs.py)
      refs/<name, %-quoted>.json                      which id a name meant when it was shared

and a user whose own cache lacks an image, and who has no engine to ask, copies it from there into their own
(configure.unpacked_image), as they would pull it: a box's root must be its user's own tree, since the runtime makes the box's mount points in
it from inside the box's user namespace, which maps none of the shared tree's owners (root's, to its kernel
nobody's) and may write nothing of theirs. Every file there is root's, writable by root alone, readable by all,
with no set-uid or set-gid bit: a tree any user may read must give no user a file of theirs to change under
another's copy, nor any host user a set-uid program of the image's to run. An image root shares is one root
means every user to have, whole.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
import urllib.parse
from dataclasses import asdict, replace
from pathlib import Path

from quinebox.box.images import rootfs
from quinebox.box.spec import ImageInfo
from quinebox.errors import ImageError

DEFAULT_ROOT = "/var/lib/quinebox/images"
#: What a shared file keeps of its mode: its permissions and sticky bit, never set-uid or set-gid; and what it gains
#: (readable by all; a directory searchable by all), so that every user can copy it whole.
_KEPT, _READABLE, _SEARCHABLE = 0o1777, 0o444, 0o111


def shared_root() -> Path:
    return Path(os.environ.get("QUINEBOX_SHARED_IMAGES") or DEFAULT_ROOT)


def _ref(name: str) -> Path:
    return shared_root() / "refs" / (urllib.parse.quote(rootfs.familiar(name), safe="") + ".json")


def lookup(name: str) -> tuple[ImageInfo, str] | None:
    """(the image `name` meant when root shared it, its tree), or None when the shared cache has none."""
    try:
        image_id = name if name.startswith("sha256:") else json.loads(_ref(name).read_text())["id"]
        folder = shared_root() / rootfs.id_hex(image_id)
        info = replace(rootfs.read_image_json(folder), name=name)
    except (OSError, ValueError, KeyError, TypeError, ImageError):
        return None
    tree = folder / rootfs.ROOTFS
    return (info, str(tree)) if tree.is_dir() else None


def copy_into(root: Path, tree: str) -> None:
    """A user's own copy of a shared `tree` at `root` (rootfs.unpack's fill): modes kept, owned by the user."""
    shutil.copytree(tree, root, symlinks=True)


def share(info: ImageInfo, tree: str) -> Path:
    """As root: `info`'s unpacked `tree` copied into the shared cache (made root's, set-ids dropped), its name
    recorded; where it now is. Copied into a scratch directory and renamed into place, as rootfs.py unpacks."""
    if os.geteuid() != 0:
        raise ImageError("only root fills the shared image cache: run `sudo quinebox image share NAME`")
    root = shared_root()
    final = root / rootfs.id_hex(info.id)
    try:
        (root / "refs").mkdir(mode=0o755, parents=True, exist_ok=True)
        if not (final / rootfs.ROOTFS).is_dir():
            scratch = Path(tempfile.mkdtemp(prefix=".sharing-", dir=root))
            try:
                shutil.copytree(tree, scratch / rootfs.ROOTFS, symlinks=True)
                _make_public(scratch / rootfs.ROOTFS)
                (scratch / rootfs.IMAGE_JSON).write_text(json.dumps(asdict(info), indent=1) + "\n")
                os.chmod(scratch, 0o755)
                os.rename(scratch, final)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
        with tempfile.NamedTemporaryFile("w", dir=root / "refs", prefix=".new-", delete=False) as file:
            json.dump({"name": rootfs.familiar(info.name), "id": info.id}, file)
        os.chmod(file.name, 0o644)
        os.replace(file.name, _ref(info.name))
    except OSError as exc:
        raise ImageError(f"cannot share image {info.name} in {root}: {exc.strerror or exc}") from None
    return final / rootfs.ROOTFS


def _make_public(tree: Path) -> None:
    """Every entry of `tree` root's, and none set-uid or set-gid (see the module's docstring)."""
    for here, dirs, files in os.walk(tree):
        for path in [here] if here == str(tree) else []:
            _own(path)
        for name in (*dirs, *files):
            _own(os.path.join(here, name))


def _own(path: str) -> None:
    mode = os.lstat(path).st_mode
    os.lchown(path, 0, 0)
    if not stat.S_ISLNK(mode):
        os.chmod(path, stat.S_IMODE(mode) & _KEPT | _READABLE | (_SEARCHABLE if stat.S_ISDIR(mode) else 0))

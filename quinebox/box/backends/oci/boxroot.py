"""Each box's own root: the image's unpacked tree as the read-only lower layer of an overlay of the box's own.

An OCI runtime makes every mount point the config names inside the root it is given — `/notes.txt` for
`-g ro:./notes.txt=/notes.txt`, `/opt/newdir/deep`, `/world`, `/run/quinebox/host.sock` — and leaves them there.
Given the shared unpacked image (rootfs.py) as the root, it wrote one box's grants into every later box of that
image. So a box's root is an overlay: the image's tree is its lower layer, never written (overlayfs does not
write a lower layer), and its upper layer is a tmpfs of the box's own, where the runtime makes the mount points
and where they vanish with the box. The root stays read-only in the box (the config's `root.readonly`: the
runtime remounts the overlay read-only once its mounts are made), so the upper layer holds nothing but them.

Why this and not another way:

- An overlay is what the engine does (each container's own layer over the shared image layers), and what
  BuildBuddy's OCI runner does over its cached layers. It handles every destination alike, however deep,
  whatever lies beneath it in the image, with no knowledge here of how the runtime makes its mount points.
- A skeleton root of the box's own (the image's top-level entries bound into a fresh directory) would keep the
  cache clean only for top-level destinations: `/opt/newdir/deep` would still be made inside the image's /opt.
- Making the mount points in the cache once and for all cannot work for grants: each box names its own.
- Cost: a tmpfs and an overlay mounted, and both detached at once, ~0.5 ms beside the runtime's ~28 ms.

Both are mounted in the host's mount namespace just long enough for the runtime to take the root, and are
detached as soon as `run` returns: the box's mount namespace keeps its own copy, which lives as long as the box,
so the host holds no mount of any box's, and a quinebox killed mid-start leaves at most one, which the keeper
and `gc` detach (`detach`). Its layers are named through /proc/self/fd, so no path (commas,
colons, its length) can be misread as mount options. gVisor's runsc is handed the same directory: its gofer
serves the overlay as it would the image's tree.

A rootless box (a runtime in a user namespace, made by a user who is not root) cannot have the host mount this;
the kernel (≥ 5.11) lets the owner of a user namespace mount an overlay in it, so there the same overlay is the
config's first mount, at `/` over the box's empty root (`in_namespace`): the runtime mounts it in the box's own
namespace, and the host never holds it. Its layers are a directory of the box's own in /dev/shm, linked from
the bundle and removed with it (overlayfs in a user namespace keeps its own attributes as `user.` xattrs, which
tmpfs holds); in the bundle itself where there is no /dev/shm.

A box granted `rootfs:rw` keeps its root writable: the same overlay, the config's `root.readonly` false, its upper
layer the box's own writable layer (the engine's container layer, said the same way). Its bytes count against the
box: a root-made box's layer is a tmpfs sized by its `tmp:` grant (the size policy.root_layer gives, in the
config's ROOT_LAYER annotation), its pages charged to the box's memory cgroup as every tmpfs write of its is; a
rootless box's, in /dev/shm, is bounded by its memory cgroup and /dev/shm's own size (a user namespace cannot mount
a tmpfs where runc resolves the overlay's layers). It goes with the box, as the read-only one does: nothing of it
is in the image's tree or on disk. In a root-made box the image's tree, whose owners are the host's ids and so
no one in the box's namespace, is its lower layer through an idmapped mount (idview.py): the image's root-owned
files are the box's own root's, as in a container of the engine's, so the box's root (an exec as user root,
which holds no capability) may change what the image's root owns; on disk nothing changes owner, and the cache's
files are never written.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import signal
import stat
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from quinebox.box.backends.oci import idmap, idview
from quinebox.box.backends.oci.runtime import deleted
from quinebox.box.policy import LABEL_PREFIX, ROOT_LAYER
from quinebox.errors import EngineError
from quinebox.state import run_dir

#: The box's root and the tmpfs its upper layer lives on, in the box's bundle directory.
ROOT = "rootfs"
LAYER = "layer"
#: The annotation naming the image's tree a box's root lies over: the image is in use while the box is (gc).
IMAGE_ROOT = LABEL_PREFIX + "image-root"
#: What the upper layer may hold: mount points (empty files and directories), never the box's data; unless the box
#: holds `rootfs:rw`, whose layer holds what it writes, as many bytes as the config's ROOT_LAYER says.
LAYER_OPTIONS = "size=1m,nr_inodes=4096,mode=0700"
WRITABLE_LAYER_OPTIONS = "size={},mode=0700"
MS_NOSUID, MS_NODEV = 0x2, 0x4
MNT_DETACH, UMOUNT_NOFOLLOW = 0x2, 0x8

#: A tmpfs every user may make a directory in, for a rootless box's layers (_shared_memory_layer).
SHM = "/dev/shm"
#: In a rootless box's layer directory there, its bundle's absolute path: `gc` sweeps a layer whose bundle went.
BUNDLE_RECORD = "bundle"
#: What an overlay's options cannot hold in a path given by name (in_namespace), where no /proc/self/fd can help.
_UNSAYABLE = ",:\\"

_libc = ctypes.CDLL(None, use_errno=True)


def _mount(source: str, target: str, fstype: str, data: str) -> None:
    if _libc.mount(source.encode(), target.encode(), fstype.encode(), MS_NOSUID | MS_NODEV, data.encode()) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), target)


def _unmount(target: Path) -> None:
    """Detach a mount here, if any; a directory with none mounted on it is left as it is."""
    if _libc.umount2(str(target).encode(), MNT_DETACH | UMOUNT_NOFOLLOW) != 0 and ctypes.get_errno() not in (errno.EINVAL, errno.ENOENT):
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(target))


#: Where the boxes' cgroups are (`_remove_cgroups`), and the users' delegated cgroups they may lie in (rootless.py).
CGROUPS = Path("/sys/fs/cgroup")
DELEGATED_GLOB = "quinebox.user-*"
#: What a bundle's directory name ends with, after its box's session.
BUNDLE_SUFFIX = ".oci"


def bundle_of(session: str) -> Path:
    """Where the box of `session` keeps its bundle: its config, its root, its runtime's log."""
    return run_dir() / f"{session}{BUNDLE_SUFFIX}"


def bundles() -> list[tuple[str, Path]]:
    """(session, bundle) of every bundle here, whether or not its box still runs."""
    return [(path.name[: -len(BUNDLE_SUFFIX)], path) for path in sorted(run_dir().glob(f"*{BUNDLE_SUFFIX}"))]


def writable_layer(config: dict[str, Any]) -> int | None:
    """The bytes a box's writable root layer may hold (its config's ROOT_LAYER annotation); None: a read-only root."""
    size = config.get("annotations", {}).get(ROOT_LAYER)
    return int(size) if isinstance(size, str) and size.isdigit() and not config.get("root", {}).get("readonly", True) else None


def layered(image_root: str, bundle: Path, *, ids: idmap.IdRange | None = None, mounts: Sequence[dict[str, Any]] = (), writable: int | None = None) -> str:
    """The box's root in `bundle`, the image's tree `image_root` under an empty layer of the box's own: its path.

    `ids`: a root-made box's own host ids (idmap.py): its root is where `in_slot` put it, its upper layer is
    that namespace's root's, and the mount points of `mounts` (the config's) are made here, as the host's root,
    since the namespace's root may not write the image's directories (the host's root owns them, unmapped
    there). `writable`: a box granted `rootfs:rw`, whose layer holds this many bytes of what it writes (with
    `ids`, over an idmapped view of the image: idview.py). Mounted until `detach(bundle)`; EngineError (nothing
    left mounted) when the kernel refuses."""
    root, layer = bundle / ROOT, bundle / LAYER
    try:
        if ids is None:
            root.mkdir()
        else:
            root = Path(os.readlink(root))
        layer.mkdir()
        _mount("tmpfs", str(layer), "tmpfs", LAYER_OPTIONS if writable is None else WRITABLE_LAYER_OPTIONS.format(writable))
        try:
            (layer / "upper").mkdir()
            (layer / "work").mkdir()
            # The merged root takes the upper layer's mode and owner, not the image's: under a host's umask of 077
            # a box's user could not even enter `/`, so the layer is given the image root's own.
            image = os.stat(image_root)
            os.chmod(layer / "upper", stat.S_IMODE(image.st_mode))
            if os.geteuid() == 0:
                owner = (image.st_uid, image.st_gid) if ids is None else (_in(ids, image.st_uid), _in(ids, image.st_gid))
                os.chown(layer / "upper", *owner)
            fds = [idview.idmapped(image_root, ids) if ids is not None and writable is not None else os.open(image_root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)]
            try:
                fds += [os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for path in (layer / "upper", layer / "work")]
                _mount("overlay", str(root), "overlay", "lowerdir=/proc/self/fd/{},upperdir=/proc/self/fd/{},workdir=/proc/self/fd/{}".format(*fds))
            finally:
                for fd in fds:
                    os.close(fd)
        finally:
            _unmount(layer)  # the overlay holds its upper layer: the tmpfs needs no place of its own in the host's tree
        if ids is not None:
            mount_points(str(root), mounts, owner=None if writable is None else ids.first)
    except OSError as exc:
        detach(bundle)
        raise EngineError(f"cannot give the box a root of its own over image tree {image_root}: mounting {exc.filename} failed ({exc.strerror})") from None
    return str(root)


def in_slot(bundle: Path, ids: idmap.IdRange, mounts: Sequence[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """For a root-made box with its own ids: where its root will be mounted (the slot's directory for its session,
    the bundle's ROOT a link to it, for `layered` and `detach`), and its config's mounts with each overlay (an
    inherited world) mounted here by the host and bound in: the kernel resolves an overlay's layers by path as
    whoever mounts it, and the namespace's root may not walk the state dir's paths. Detached with the root."""
    session = bundle.name.removesuffix(BUNDLE_SUFFIX)
    root = ids.root_for(session)
    try:
        root.mkdir(mode=0o700)
        os.chown(root, ids.first, ids.first)
        (bundle / ROOT).symlink_to(root)
    except OSError as exc:
        raise EngineError(f"cannot give the box a root in its ids' slot {root.parent}: {exc.strerror} (`quinebox gc` frees slots whose boxes are gone)") from exc
    out = []
    for number, mount in enumerate(mounts):
        if mount.get("type") == "overlay" and mount["destination"] != "/":
            target = Path(f"{root}.mnt") / str(number)
            target.mkdir(mode=0o700, parents=True)
            try:
                _mount("overlay", str(target), "overlay", ",".join(mount.get("options", ())))
            except OSError as exc:
                detach(bundle)
                raise EngineError(f"cannot mount the box's {mount['destination']} (an overlay of its parent's layers): {exc.strerror}") from None
            mount = {"destination": mount["destination"], "type": "bind", "source": str(target), "options": ["rbind", "rprivate", "rw"]}
        out.append(mount)
    return str(root), out


def _in(ids: idmap.IdRange, host_id: int) -> int:
    """The image's owner `host_id` as the same id in the box's namespace (its root is its namespace's root)."""
    return ids.host(host_id) if host_id < ids.span else ids.first


def mount_points(root: str, mounts: Sequence[dict[str, Any]], *, owner: int | None = None) -> None:
    """Make each mount's destination in the box's `root` (a directory, or an empty file for a bind of one), as the
    runtime would, walking from a directory fd with O_NOFOLLOW at every step: a link in the image is never followed
    out of the root (a destination behind one is left to the runtime, which resolves it inside the root). One that
    lands inside another mount (/dev/pts in /dev's tmpfs) is the runtime's to make there, where its root may.
    `owner`: in a writable root, the box's root's host id (its slot's first), which owns what is made here (not the
    host's root, unmapped in the box), so it may write beside a grant (/logs/agent beside a granted /logs/verifier)."""
    targets = [m["destination"] for m in mounts]
    for mount in mounts:
        dest = os.path.normpath(mount["destination"])
        if dest == "/" or any(other != dest and dest.startswith(other.rstrip("/") + "/") for other in targets):
            continue
        source = mount.get("source")
        is_file = mount.get("type") == "bind" and isinstance(source, str) and os.path.exists(source) and not os.path.isdir(source)
        _make_point(root, dest.strip("/").split("/"), is_file, owner)


def _make_point(root: str, parts: list[str], is_file: bool, owner: int | None) -> None:
    fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for depth, name in enumerate(parts):
            last = depth == len(parts) - 1
            try:
                if last and is_file:
                    os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=fd))
                    if owner is not None:
                        os.chown(name, owner, owner, dir_fd=fd, follow_symlinks=False)
                    return
                os.mkdir(name, 0o755, dir_fd=fd)
                if owner is not None:
                    os.chown(name, owner, owner, dir_fd=fd, follow_symlinks=False)
            except FileExistsError:
                pass
            except OSError:
                return  # a link, a file where a directory goes: the runtime's to answer
            try:
                child = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError:
                return
            os.close(fd)
            fd = child
    finally:
        os.close(fd)


def in_namespace(image_root: str, bundle: Path) -> list[dict[str, Any]]:
    """For a rootless box: the box's root over `image_root` as the config's first mount, made by the runtime in
    the box's own user namespace (see above); the bundle's ROOT left an empty directory for it to land on. For
    the host's own `/`, which no user namespace may overlay, none: the root is that directory with the host's
    top-level links in it, and the config binds in what the box is shown (policy_host.py)."""
    (bundle / ROOT).mkdir(mode=0o700)
    if image_root == "/":
        with os.scandir("/") as entries:
            for entry in entries:
                if entry.is_symlink():
                    os.symlink(os.readlink(entry.path), bundle / ROOT / entry.name)
        os.chmod(bundle / ROOT, 0o755)
        return []
    layer = _shared_memory_layer(bundle)
    upper, work = layer / "upper", layer / "work"
    for path in (upper, work):
        path.mkdir(mode=0o700)
    unsayable = next((path for path in (image_root, str(upper), str(work)) if any(c in path for c in _UNSAYABLE)), None)
    if unsayable is not None:
        raise EngineError(
            f"cannot give the box a root of its own: an overlay cannot name {unsayable} (a comma, colon or backslash in it); "
            "set QUINEBOX_STATE_DIR to a plainer path"
        )
    os.chmod(upper, stat.S_IMODE(os.stat(image_root).st_mode))
    return [{"destination": "/", "type": "overlay", "source": "overlay",
             "options": [f"lowerdir={image_root}", f"upperdir={upper}", f"workdir={work}", "userxattr", "nosuid", "nodev"]}]


def _shared_memory_layer(bundle: Path) -> Path:
    """Where a rootless box's layers go: a directory of the box's own in /dev/shm (a tmpfs, as a root-made box's
    layer is), linked from the bundle as LAYER and removed with it; in the bundle itself where there is none.
    Never the file system of the image's tree: overlayfs refuses an upper layer inside its lower one, which
    the host's own `/` (`--image host`) would otherwise be."""
    try:
        layer = Path(tempfile.mkdtemp(prefix=f"quinebox-{os.getuid()}-{bundle.name}-", dir=SHM))
    except OSError:
        (bundle / LAYER).mkdir(mode=0o700)
        return bundle / LAYER
    (bundle / LAYER).symlink_to(layer)
    (layer / BUNDLE_RECORD).write_text(os.path.abspath(bundle))
    return layer


def sweep_layers() -> None:
    """Remove this user's rootless layers in /dev/shm whose recorded bundle is gone (`gc`). A layer with no record
    (one being made this instant, or made before records were) is left, as is one not this user's."""
    for entry in Path(SHM).glob(f"quinebox-{os.getuid()}-*"):
        try:
            info = entry.lstat()
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
                continue
            bundle = (entry / BUNDLE_RECORD).read_text()
        except OSError:
            continue
        if os.path.isabs(bundle) and not os.path.lexists(bundle):
            shutil.rmtree(entry, **_UNREADABLE)


def detach(bundle: Path) -> None:
    """Detach the box's root from the host's mount namespace (its box keeps its own copy while it runs); safe to
    call again, or for a bundle that never had one. Before any removal of the bundle: a removal that walked into a
    mounted root would spend its time making whiteouts. A root-made box's root is in its ids' slot (the bundle's
    ROOT links there: `in_slot`), with the overlays the host mounted for it beside it."""
    root = bundle / ROOT
    targets = [root, bundle / LAYER]
    if root.is_symlink():
        slot_root = Path(os.readlink(root))
        mounts = Path(f"{slot_root}.mnt")
        targets = [slot_root, *(mounts / name for name in idmap.entries(mounts)), bundle / LAYER]
    for target in targets:
        try:
            _unmount(target)
        except OSError:
            pass  # not ours to detach (EPERM): the bundle's removal then stops at it, and the cache is not written


def remove_box(runtime: list[str], cid: str, bundle: Path | None) -> bool:
    """The one way a box on an OCI runtime and its remains go, for its owner, its keeper, gc and `box rm` alike:
    deleted by `runtime` (a Runtime's argv), then its bundle. True only when both are gone; a delete that failed
    leaves the bundle, and the box listed, for the next try."""
    if not deleted(runtime, cid):
        return False
    _remove_cgroups(cid)
    if bundle is not None:  # a keeper told of none (never from our own hold) removes the box alone
        remove_bundle(bundle)
    return True


def _remove_cgroups(cid: str) -> None:
    """The box's own cgroups (named as its container: oci/policy.py's cgroupsPath), where its runtime left them: one
    that no longer knows the box (its state went with a state dir a job removed) neither kills its processes nor
    deletes its cgroups. What is still in them is the box's alone, killed; then each goes, once empty. At the top
    of each hierarchy, or below a user's delegated v1 one (setup-user's); a v2 subtree systemd delegates is
    deeper, and `gc` sweeps what is left there."""
    groups = [g for pattern in (cid, f"*/{cid}", f"{DELEGATED_GLOB}/{cid}", f"*/{DELEGATED_GLOB}/{cid}") for g in CGROUPS.glob(pattern)]
    for group in groups:
        for pid in _procs(group):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    deadline = time.monotonic() + 2
    while groups and time.monotonic() < deadline:
        for group in list(groups):
            try:
                os.rmdir(group)
            except FileNotFoundError:
                pass
            except OSError:
                continue  # its processes still exiting
            groups.remove(group)
        if groups:
            time.sleep(0.01)


def _procs(group: Path) -> list[int]:
    try:
        return [int(line) for line in (group / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def remove_bundle(bundle: Path) -> None:
    """A box's bundle removed, its root detached first (a box removes its own as soon as it ends, see ocibox).
    A rootless box's overlay leaves its work directory unreadable (mode 0, as overlayfs makes it): opened up."""
    detach(bundle)
    _release_ids(bundle)
    layer = bundle / LAYER
    if layer.is_symlink():  # a rootless box's layers, in /dev/shm (_shared_memory_layer)
        shutil.rmtree(os.readlink(layer), **_UNREADABLE)
    shutil.rmtree(bundle, **_UNREADABLE)


def _release_ids(bundle: Path) -> None:
    """A root-made box's own ids given back (idmap.py) once its root is detached: its config names them."""
    try:
        config = json.loads((bundle / "config.json").read_text())
    except (OSError, ValueError):
        return
    ids = idmap.range_of(config.get("linux", {}).get("uidMappings")) if isinstance(config, dict) and isinstance(config.get("linux"), dict) else None
    if ids is not None and os.geteuid() == 0:
        idmap.release(ids, bundle.name[: -len(BUNDLE_SUFFIX)])


def _open_up(function: Any, path: str, exc: Any) -> None:
    """rmtree's answer to a directory it could not read or empty: made the owner's to read, and tried again."""
    try:
        os.chmod(path, 0o700)
        shutil.rmtree(path, ignore_errors=True)
    except OSError:
        pass


_UNREADABLE: dict[str, Any] = {"onexc" if sys.version_info >= (3, 12) else "onerror": _open_up}

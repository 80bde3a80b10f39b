"""An unpacked image's seal sees every change made to its tree, and a changed tree leaves the cache (eviction.py); each
box's root lies over the tree without writing it (real mounts, as root)."""

import json
import os
import re
import stat
from pathlib import Path

import pytest

from quinebox.box.backends.oci import boxroot
from quinebox.box.images import eviction, rootfs, seal
from quinebox.box.spec import ImageInfo
from quinebox.errors import EngineError

ROOT = os.geteuid() == 0
IMAGE = ImageInfo(name="t/sealed:1", id="sha256:" + "5" * 64)


@pytest.fixture(autouse=True)
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("QUINEBOX_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def fill(root: Path) -> None:
    """A small tree with every kind of entry an image has."""
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "os-release").write_text("ID=test\n")
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "usr" / "bin" / "tool").write_bytes(b"#!/bin/sh\n")
    os.chmod(root / "usr" / "bin" / "tool", 0o755)
    (root / "bin").symlink_to("usr/bin")
    (root / "tmp").mkdir(mode=0o1777)
    (root / "empty").mkdir()


def same_size_rewrite(root: Path) -> None:
    """New content of the same length, its times set back to what they were: only ctime tells."""
    path = root / "etc" / "os-release"
    before = path.stat()
    path.write_text("ID=evil\n"[: before.st_size].ljust(before.st_size))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def retarget(root: Path) -> None:
    (root / "bin").unlink()
    (root / "bin").symlink_to("usr/sbin")
    os.utime(root, ns=(0, 0))


#: (what is done to the tree, what `changed` says)
CHANGES = [
    ("a file added at the top", lambda r: (r / "notes.txt").touch(), "it holds 9 entries, 8 when it was unpacked"),
    ("a directory added deep down", lambda r: (r / "usr" / "bin" / "newdir").mkdir(), "it holds 9 entries, 8 when it was unpacked"),
    ("a file removed", lambda r: (r / "usr" / "bin" / "tool").unlink(), "it holds 7 entries, 8 when it was unpacked"),
    ("an empty directory removed", lambda r: (r / "empty").rmdir(), "it holds 7 entries, 8 when it was unpacked"),
    ("a mode changed", lambda r: os.chmod(r / "etc" / "os-release", 0o666), "differ"),
    ("the root's own mode changed", lambda r: os.chmod(r, 0o777), "differ"),
    ("an owner changed", lambda r: os.chown(r / "etc" / "os-release", 1000, 1000) if ROOT else os.chmod(r / "etc", 0o700), "differ"),
    ("content appended", lambda r: (r / "etc" / "os-release").open("a").write("X=1\n"), "differ"),
    ("content rewritten at the same size, mtime restored", same_size_rewrite, "differ"),
    ("an mtime set back", lambda r: os.utime(r / "usr" / "bin" / "tool", ns=(0, 0)), "differ"),
    ("a file renamed", lambda r: os.rename(r / "etc" / "os-release", r / "etc" / "os-releasf"), "differ"),
    ("a link retargeted, the directory's times set back", retarget, "differ"),
]


@pytest.mark.parametrize("what, change, said", CHANGES, ids=[c[0] for c in CHANGES])
def test_the_seal_sees_every_change_to_the_tree(tmp_path, what, change, said):
    fill(tmp_path / "rootfs")
    seal.write(tmp_path, tmp_path / "rootfs")
    assert seal.changed(tmp_path, tmp_path / "rootfs") is None
    change(tmp_path / "rootfs")
    assert said in (seal.changed(tmp_path, tmp_path / "rootfs") or "unchanged")


def test_reading_the_tree_changes_nothing_and_a_missing_or_broken_seal_is_a_change(tmp_path):
    fill(tmp_path / "rootfs")
    seal.write(tmp_path, tmp_path / "rootfs")
    for top, dirs, files in os.walk(tmp_path / "rootfs"):
        for name in files:
            Path(top, name).read_bytes()
        os.listdir(top)
    assert seal.changed(tmp_path, tmp_path / "rootfs") is None
    assert json.loads((tmp_path / seal.SEAL).read_text())["entries"] == 8
    (tmp_path / seal.SEAL).write_text("{not json")
    assert seal.changed(tmp_path, tmp_path / "rootfs") == "its seal cannot be read"
    (tmp_path / seal.SEAL).unlink()
    assert "no seal" in seal.changed(tmp_path, tmp_path / "rootfs")


def test_an_unpack_is_sealed_and_of_the_changed_trees_only_those_no_box_uses_leave(state):
    tree = rootfs.unpack(IMAGE, "docker-archive", fill)
    other = ImageInfo(name="t/other:1", id="sha256:" + "6" * 64)
    busy = ImageInfo(name="t/busy:1", id="sha256:" + "7" * 64)
    trees = {info.id: rootfs.unpack(info, "docker-archive", fill) for info in (other, busy)}
    assert seal.changed(tree.parent, tree) is None
    assert eviction.changed(set()) == {}
    (tree / "notes.txt").touch()
    (trees[busy.id] / "notes.txt").touch()
    assert eviction.changed({busy.id[7:]}) == {tree.parent: "it holds 9 entries, 8 when it was unpacked"}
    assert [(e.name, e.why) for e in eviction.evict({busy.id[7:]}, {IMAGE.id, other.id, busy.id})] == [(IMAGE.id[7:], "it holds 9 entries, 8 when it was unpacked")]
    assert rootfs.unpacked(IMAGE.id) is None and rootfs.unpacked(other.id) and rootfs.unpacked(busy.id)
    assert not [p for p in rootfs.images_root().iterdir() if p.name.startswith(rootfs.SCRATCH)]
    again = rootfs.unpack(IMAGE, "docker-archive", fill)  # the next box's unpack: whole again, sealed again
    assert not (again / "notes.txt").exists() and seal.changed(again.parent, again) is None


# -- each box's own root -----------------------------------------------------------------------


def mounts_under(path: Path) -> list[str]:
    """Mount points at or below `path`, unescaped as mountinfo writes them (a space is \\040)."""
    with open("/proc/self/mountinfo") as table:
        points = [re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), line.split()[4]) for line in table]
    return [point for point in points if point.startswith(str(path))]


@pytest.mark.skipif(not ROOT, reason="mounting a box's root needs root, as the OCI backend does")
@pytest.mark.parametrize("where", ["plain", "a dir, with: commas=and,colons"])
def test_a_boxs_root_takes_mount_points_without_writing_the_image(tmp_path, where):
    image = tmp_path / where / "image"
    fill(image)
    seal.write(tmp_path / where, image)
    bundle = tmp_path / where / "box.oci"
    bundle.mkdir()
    root = Path(boxroot.layered(str(image), bundle))
    try:
        assert mounts_under(tmp_path) == [str(root)]  # the layer's tmpfs is the overlay's alone, at no path of the host's
        assert sorted(os.listdir(root)) == sorted(os.listdir(image))
        (root / "notes.txt").touch()  # as a runtime makes mount points
        (root / "opt" / "newdir" / "deep").mkdir(parents=True)
        (root / "tmp" / "x").mkdir()
        os.chmod(root / "etc", 0o700)
        assert seal.changed(tmp_path / where, image) is None
    finally:
        boxroot.detach(bundle)
    boxroot.detach(bundle)  # again: nothing to detach, no error
    assert mounts_under(tmp_path) == [] and os.listdir(root) == []
    assert stat.S_IMODE(os.stat(image / "etc").st_mode) == 0o755


@pytest.mark.skipif(not ROOT, reason="mounting a box's root needs root, as the OCI backend does")
def test_a_root_that_cannot_be_mounted_is_one_line_and_leaves_no_mount(tmp_path):
    bundle = tmp_path / "box.oci"
    bundle.mkdir()
    with pytest.raises(EngineError, match=r"^cannot give the box a root of its own over image tree .*/gone: mounting .* failed \(.+\)$"):
        boxroot.layered(str(tmp_path / "gone"), bundle)
    assert mounts_under(tmp_path) == []

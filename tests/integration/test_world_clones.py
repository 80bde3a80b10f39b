"""Worlds copied copy-on-write where the filesystem can (quinebox/worlds/build.py's copy_file).

A world made from host copies, a snapshot's world, and each fork's copy of it share their blocks with what they
were copied from on btrfs or XFS (FICLONE), and are copied byte for byte elsewhere. Either way a copy is its own:
what is written to one is never seen in the other. The XFS here is a real one, made on a loop device.
"""

import os
import subprocess
from pathlib import Path

import pytest

from quinebox.box.live.checkpoints import copy_world
from quinebox.worlds.build import copy_file

def shared(path: Path) -> bool:
    """Whether every extent of the file is shared with another file (the kernel's FIEMAP, as filefrag shows it)."""
    report = subprocess.run(["filefrag", "-v", str(path)], capture_output=True, text=True, check=True, timeout=30).stdout
    extents = [line for line in report.splitlines() if line.strip()[:1].isdigit() and ":" in line]
    assert extents, report
    return all("shared" in line for line in extents)


@pytest.fixture
def xfs(tmp_path):
    """An XFS filesystem of 320 MiB on a loop device (reflinks on, as mkfs.xfs makes it), unmounted after."""
    image, mount = tmp_path / "xfs.img", tmp_path / "xfs"
    mount.mkdir()
    with open(image, "wb") as f:
        f.truncate(320 << 20)
    subprocess.run(["mkfs.xfs", "-q", str(image)], check=True, timeout=60)
    subprocess.run(["mount", "-o", "loop", str(image), str(mount)], check=True, timeout=60)
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True, timeout=60)


@pytest.mark.root_only  # mounting a filesystem for the test needs root
def test_a_file_copied_on_xfs_shares_its_blocks_until_written(xfs):
    source, target = xfs / "big", xfs / "copy"
    data = os.urandom(1 << 20)
    source.write_bytes(data)
    source.chmod(0o640)
    os.utime(source, (1_000_000_000, 1_000_000_000))
    copy_file(str(source), str(target))
    assert shared(target) and shared(source)
    assert target.read_bytes() == data
    assert (target.stat().st_mode & 0o7777, target.stat().st_mtime) == (0o640, 1_000_000_000)
    with open(target, "r+b") as f:
        f.write(b"written in the copy")
    assert source.read_bytes() == data
    assert target.read_bytes() == b"written in the copy" + data[len(b"written in the copy"):]


@pytest.mark.root_only  # mounting a filesystem for the test needs root
def test_a_snapshot_s_world_on_xfs_is_a_copy_on_write_of_the_box_s(xfs):
    layer, into = xfs / "layer", xfs / "snapshot-world"
    (layer / "src").mkdir(parents=True)
    (layer / "src" / "main.py").write_bytes(b"print('hi')\n" * 10_000)
    (layer / "link").symlink_to("src/main.py")
    copy_world(layer, into, "s-test")
    assert shared(into / "src" / "main.py")
    assert os.readlink(into / "link") == "src/main.py"
    (into / "src" / "main.py").write_bytes(b"changed\n")
    assert (layer / "src" / "main.py").read_bytes() == b"print('hi')\n" * 10_000


def test_where_blocks_cannot_be_shared_a_file_is_copied_as_copy2_copies_it(tmp_path):
    """/tmp here is on ext4, which has no reflinks."""
    source, target = tmp_path / "file", tmp_path / "copy"
    source.write_bytes(b"bytes\n" * 1000)
    source.chmod(0o604)
    os.utime(source, (1_000_000_000, 1_000_000_000))
    copy_file(str(source), str(target))
    assert target.read_bytes() == b"bytes\n" * 1000
    assert (target.stat().st_mode & 0o7777, target.stat().st_mtime) == (0o604, 1_000_000_000)
    assert not shared(target)
    (tmp_path / "link").symlink_to("/etc/shadow")  # a link stays a link, never followed
    copy_file(str(tmp_path / "link"), str(tmp_path / "link-copy"))
    assert os.readlink(tmp_path / "link-copy") == "/etc/shadow"

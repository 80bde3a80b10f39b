"""`--world-tar` against archives of any shape: refused whole, or unpacked with nothing outside the world.

Generated members: names with `..`, absolute names, links in and out,
hard links, devices, FIFOs, setuid bits, sizes; the archive either imports
with every entry beneath the world and no special file or setuid bit, or is
refused with a WorldError, and nothing outside the world ever changes.
"""

import io
import os
import stat
import tarfile
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quinebox.worlds.build import import_archive
from quinebox.worlds.revisions import WorldError

PIECES = st.sampled_from(["a", "b", "..", ".", "", "c d", "/", "../outside", "/etc/passwd", "a/../..", "x" * 40])
NAMES = st.lists(PIECES, min_size=1, max_size=4).map("/".join)
TYPES = st.sampled_from([tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.FIFOTYPE, tarfile.CHRTYPE])
MEMBER = st.tuples(NAMES, TYPES, NAMES, st.binary(max_size=64), st.sampled_from([0o644, 0o755, 0o4755, 0o2755, 0o000, 0o777]))


def archive(members) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, kind, link, data, mode in members:
            info = tarfile.TarInfo(name or "empty")
            info.type, info.mode = kind, mode
            if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                info.linkname = link
            if kind == tarfile.REGTYPE:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return buf.getvalue()


def snapshot(root: str) -> dict:
    seen = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st_ = os.lstat(path)
            seen[path] = (st_.st_mode, st_.st_size, st_.st_mtime_ns)
    return seen


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(MEMBER, min_size=1, max_size=8))
def test_an_archive_is_refused_whole_or_lands_beneath_the_world_only(members):
    with tempfile.TemporaryDirectory() as scratch:
        outside, into = os.path.join(scratch, "outside"), os.path.join(scratch, "world")
        os.makedirs(os.path.join(outside, "etc"))
        with open(os.path.join(outside, "etc", "passwd"), "w") as f:
            f.write("root:x:0:0\n")
        os.mkdir(into)
        path = os.path.join(scratch, "w.tar")
        with open(path, "wb") as f:
            f.write(archive(members))
        before = snapshot(outside)
        try:
            import_archive(path, into)
        except WorldError:
            pass
        assert snapshot(outside) == before
        root = os.path.realpath(into)
        for dirpath, dirnames, filenames in os.walk(into):
            for name in dirnames + filenames:
                entry = os.path.join(dirpath, name)
                mode = os.lstat(entry).st_mode
                assert stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode), entry
                assert not mode & (stat.S_ISUID | stat.S_ISGID), entry
                if stat.S_ISLNK(mode):
                    try:
                        target = os.path.realpath(entry, strict=True)
                    except OSError:  # a loop, or nothing there: where it points, by its text
                        target = os.path.normpath(os.path.join(os.path.realpath(dirpath), os.readlink(entry)))
                    assert target == root or target.startswith(root + os.sep), (entry, os.readlink(entry))

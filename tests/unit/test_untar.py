"""quinebox/untar.py on the running Python: each unsafe member kind refused with its message and nothing written,
safe archives unpacked byte-exact with the `data` filter's modes, from a file and from a stream alike."""

import gzip
import io
import os
import stat
import tarfile
import time
import tracemalloc

import pytest

from quinebox import untar

CAPS = {"max_members": 1000, "max_bytes": 1 << 20}
#: A name just within PATH_MAX (4095 bytes); with the destination's own path before it, past it.
DEEP = ["deep", *["d" * 200] * 20, "leaf"]


def member(name, data=b"", **fields):
    info = tarfile.TarInfo(name)
    info.size = len(data) if fields.get("type", tarfile.REGTYPE) == tarfile.REGTYPE else 0
    info.mtime = 1_700_000_000
    for key, value in fields.items():
        setattr(info, key, value)
    return info, data if info.type == tarfile.REGTYPE else None


def tar_of(*members, fmt=tarfile.PAX_FORMAT):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def sym(name, target):
    return member(name, type=tarfile.SYMTYPE, linkname=target)


def hard(name, target):
    return member(name, type=tarfile.LNKTYPE, linkname=target)


def tree(root):
    """Everything under `root` but DEEP (past PATH_MAX from /): (kind, mode, content or link target) by relative path."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != DEEP[0]]
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            rel = os.path.relpath(path, root)
            if stat.S_ISLNK(st.st_mode):
                found[rel] = ("link", None, os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                found[rel] = ("dir", st.st_mode & 0o7777, None)
            else:
                found[rel] = ("file", st.st_mode & 0o7777, open(path, "rb").read())
    return found


def unpack_both_ways(tmp_path, archive):
    """Unpack from a file and from a stream; the two results, each as `tree` sees it, or the Refused raised."""
    results = []
    for how in ("file", "stream"):
        into = tmp_path / how
        into.mkdir()
        path = tmp_path / f"{how}.tar"
        path.write_bytes(archive)
        try:
            if how == "file":
                untar.unpack(str(path), str(into), **CAPS)
            else:
                with open(path, "rb") as stream:
                    untar.unpack(stream, str(into), **CAPS)
        except untar.Refused as exc:
            results.append((str(exc), tree(into)))
        else:
            results.append((None, tree(into)))
    return results


@pytest.mark.parametrize(
    "members, message",
    [
        ([member("/etc/cron.d/x", b"x")], "/etc/cron.d/x is an absolute name"),
        ([member("../escape", b"x")], "'../escape' would be extracted outside the destination (it names '..')"),
        ([member("a/../../escape", b"x")], "'a/../../escape' would be extracted outside the destination"),
        ([sym("link", "/etc")], "'link' is a link to an absolute path (/etc)"),
        ([sym("link", "../outside")], "'link' would link to '../outside', which is outside the destination"),
        ([sym("a/up", "../.."), member("a/x", b"x")], "'a/up' would link to '../..', which is outside the destination"),
        # Each link alone stays inside; together the first leads out once the second is there (read as the kernel reads).
        ([sym("t", "x/s/../.."), member("x/", type=tarfile.DIRTYPE), sym("x/s", "../y")], "'t' would link to 'x/s/../..', which is outside"),
        ([sym("s", "."), member("s/x", b"x")], "'s/x' goes through 's', which is a symlink or a file in the archive"),
        ([member("f", b"x"), member("f/x", b"x")], "'f/x' goes through 'f', which is a symlink or a file in the archive"),
        ([hard("hard", "/etc/passwd")], "'hard' is a link to an absolute path (/etc/passwd)"),
        ([hard("hard", "../outside")], "'hard' would link to '../outside', which is outside the destination"),
        ([hard("hard", "missing")], "hard link 'hard' names 'missing', which is nothing the archive holds before it"),
        ([member("d", type=tarfile.DIRTYPE), hard("hard", "d")], "hard link 'hard' names 'd', which is a directory"),
        # A second name of a symlink reads its target from where the new name is.
        ([sym("a/b/s", "../../y"), hard("h", "a/b/s")], "'h' would link to '../../y', which is outside the destination"),
        ([member("dev", type=tarfile.CHRTYPE, devmajor=1, devminor=3)], "dev is a device file or FIFO"),
        ([member("blk", type=tarfile.BLKTYPE, devmajor=7, devminor=0)], "blk is a device file or FIFO"),
        ([member("pipe", type=tarfile.FIFOTYPE)], "pipe is a device file or FIFO"),
        ([member("d", type=tarfile.DIRTYPE), member("d", b"x")], "'d' is in the archive both as a directory and as something else"),
        ([member(".", b"x")], "'.' names the destination itself, and is not a directory"),
        ([member(f"f{i}", b"") for i in range(1001)], "more than 1000 members"),
        ([member("big", b"x" * ((1 << 20) + 1))], f"more than {1 << 20} bytes"),
    ],
)
def test_each_unsafe_member_is_refused_with_its_message(tmp_path, members, message):
    (by_file, left_by_file), (by_stream, _) = unpack_both_ways(tmp_path, tar_of(member("fine", b"ok"), *members))
    assert by_file is not None and by_stream is not None
    assert message in by_file, by_file
    assert by_stream == by_file
    assert left_by_file == {}, "a file's headers are all checked before anything is written"
    assert not (tmp_path / "outside").exists() and not (tmp_path / "y").exists()


def test_nothing_is_written_through_a_link_already_in_the_destination(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    into = tmp_path / "into"
    into.mkdir()
    os.symlink(outside, into / "planted")
    (tmp_path / "a.tar").write_bytes(tar_of(member("planted/x", b"x")))
    with pytest.raises(untar.Refused) as refused:
        untar.unpack(str(tmp_path / "a.tar"), str(into), **CAPS)
    assert str(refused.value) == "'planted/x' goes through 'planted', which is a symlink or a file"
    assert list(outside.iterdir()) == []


def test_a_safe_archive_lands_byte_exact_with_the_data_filters_modes(tmp_path):
    payload = os.urandom(300_000)
    archive = tar_of(
        member("./", type=tarfile.DIRTYPE, mode=0o700),
        member("bin/", type=tarfile.DIRTYPE, mode=0o555),
        member("bin/tool", b"#!/bin/sh\n", mode=0o6755, uid=0, gid=0, uname="root"),
        member("data/blob", payload, mode=0o444),
        member("data/notes", b"plain\n", mode=0o066),
        member("data/shared", b"w", mode=0o777),
        member("data/empty", b"", mode=0o644),
        member("data/blob", payload[::-1], mode=0o640),  # a later member of the same name wins
        sym("link", "bin/tool"),
        sym("data/up", "../bin"),
        sym("data/dangling", "nowhere/at/all"),
        sym("loop", "loop"),
        hard("data/again", "data/notes"),
        hard("second", "link"),
        member("/".join(DEEP), b"deep"),  # past PATH_MAX with the destination: reached by fds, never by a string
    )
    expected = {
        "bin": ("dir", 0o755, None),
        "bin/tool": ("file", 0o755, b"#!/bin/sh\n"),
        "data": ("dir", 0o755, None),
        "data/blob": ("file", 0o640, payload[::-1]),
        "data/notes": ("file", 0o644, b"plain\n"),
        "data/again": ("file", 0o644, b"plain\n"),
        "data/shared": ("file", 0o755, b"w"),
        "data/empty": ("file", 0o644, b""),
        "data/up": ("link", None, "../bin"),
        "data/dangling": ("link", None, "nowhere/at/all"),
        "link": ("link", None, "bin/tool"),
        "second": ("link", None, "bin/tool"),
        "loop": ("link", None, "loop"),
    }
    for refused, found in unpack_both_ways(tmp_path, archive):
        assert refused is None
        assert found == expected
    for how in ("file", "stream"):
        root = tmp_path / how
        assert os.stat(root / "data" / "again").st_ino == os.stat(root / "data" / "notes").st_ino
        assert os.lstat(root / "bin").st_mtime == 1_700_000_000
        assert os.lstat(root).st_mtime != 1_700_000_000, "the destination was there before: the archive's './' leaves it"
        assert stat.S_IMODE(os.lstat(root).st_mode) != 0o700
        assert os.stat(root / "bin" / "tool").st_uid == os.getuid()
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        for part in DEEP[:-1]:
            fd, old = os.open(part, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd), fd
            os.close(old)
        leaf = os.open(DEEP[-1], os.O_RDONLY, dir_fd=fd)
        assert os.read(leaf, 100) == b"deep" and stat.S_IMODE(os.fstat(leaf).st_mode) == 0o644
        os.close(leaf), os.close(fd)


@pytest.mark.parametrize("compress", ["gz", "bz2", "xz"])
def test_a_compressed_archive_unpacks_from_its_file(tmp_path, compress):
    path = tmp_path / f"a.tar.{compress}"
    with tarfile.open(path, f"w:{compress}") as tar:
        info, data = member("hello", b"hi\n")
        tar.addfile(info, io.BytesIO(data))
    untar.unpack(str(path), str(tmp_path), **CAPS)
    assert (tmp_path / "hello").read_bytes() == b"hi\n"


@pytest.mark.parametrize(
    "archive",
    [b"not a tar at all" * 64, tar_of(member("a", b"x" * 5000))[:1500], gzip.compress(tar_of(member("a", b"x" * 5000)))[:-40]],
    ids=["not-tar", "truncated", "truncated-gzip"],
)
def test_a_damaged_archive_is_unreadable_not_a_traceback(tmp_path, archive):
    path = tmp_path / "bad.tar"
    path.write_bytes(archive)
    into = tmp_path / "into"
    into.mkdir()
    with pytest.raises(untar.Unreadable):
        untar.unpack(str(path), str(into), **CAPS)
    assert list(into.iterdir()) == []



@pytest.mark.parametrize("how", ["file", "stream"])
def test_a_name_of_megabytes_is_refused_at_once_and_nothing_is_made(tmp_path, how):
    """Review 49 H1: one member named "a/"*64000 + "f" (a 130 KB pax name a box can hand get_dir) took the
    host 25 s of CPU in the path check alone, then made 64 000 nested directories. Refused from its length."""
    path = tmp_path / "quadratic.tar"
    path.write_bytes(tar_of(member("a/" * 64_000 + "f")))
    into = tmp_path / "into"
    into.mkdir()
    started = time.process_time()
    with pytest.raises(untar.Refused) as refused:
        if how == "file":
            untar.unpack(str(path), str(into), **CAPS)
        else:
            with open(path, "rb") as stream:
                untar.unpack(stream, str(into), **CAPS)
    assert time.process_time() - started < 1.0
    assert "its name has 128001 bytes, more than a path can have (4095, PATH_MAX)" in str(refused.value)
    assert len(str(refused.value)) < 200
    assert list(into.iterdir()) == []


@pytest.mark.parametrize(
    "members, message",
    [
        ([member("a/" * 300 + "f", b"x")], "is 301 directories deep, more than 256"),
        ([sym("s", "x/" * 2048)], "is refused: its link target has 4096 bytes"),
        ([member("f", b"x"), hard("h", "./" * 2048 + "f")], "is refused: its link target has 4097 bytes"),
    ],
)
def test_a_name_deeper_or_longer_than_a_path_is_refused(tmp_path, members, message):
    (by_file, left), (by_stream, _) = unpack_both_ways(tmp_path, tar_of(*members))
    assert by_file is not None and message in by_file, by_file
    assert by_stream == by_file and left == {}


def test_the_deepest_name_allowed_lands(tmp_path):
    (tmp_path / "a.tar").write_bytes(tar_of(member("a/" * 255 + "f", b"x")))
    untar.unpack(str(tmp_path / "a.tar"), str(tmp_path), **CAPS)
    assert (tmp_path / ("a/" * 255 + "f")).read_bytes() == b"x"


@pytest.mark.parametrize("how", ["file", "stream"])
def test_directories_there_before_keep_their_mode_and_mtime(tmp_path, how):
    """Review 49 L3: get_dir into a local dir whose 0700 subdirectory the box's archive also names opened it
    to 0755. Only what the archive makes gets its modes; the destination and what it held stay as they were."""
    into = tmp_path / "into"
    (into / "priv").mkdir(parents=True)
    os.chmod(into, 0o700)
    os.chmod(into / "priv", 0o700)
    os.utime(into / "priv", (1_600_000_000, 1_600_000_000))
    path = tmp_path / "a.tar"
    path.write_bytes(
        tar_of(
            member("./", type=tarfile.DIRTYPE, mode=0o755),
            member("priv/", type=tarfile.DIRTYPE, mode=0o755),
            member("new/", type=tarfile.DIRTYPE, mode=0o700),
            member("priv/x", b"x"),
            member("new/y", b"y"),
        )
    )
    if how == "file":
        untar.unpack(str(path), str(into), **CAPS)
    else:
        with open(path, "rb") as stream:
            untar.unpack(stream, str(into), **CAPS)
    assert stat.S_IMODE(os.lstat(into).st_mode) == 0o700
    assert stat.S_IMODE(os.lstat(into / "priv").st_mode) == 0o700
    assert os.lstat(into / "priv").st_mtime != 1_700_000_000
    assert stat.S_IMODE(os.lstat(into / "new").st_mode) == 0o755  # made by the archive: the data filter's mode
    assert os.lstat(into / "new").st_mtime == 1_700_000_000
    assert (into / "priv" / "x").read_bytes() == b"x"


@pytest.mark.parametrize("how", ["file", "stream"])
def test_memory_is_the_plans_not_every_header_kept(tmp_path, how):
    """Review 49 L4: every header read was kept (tarfile's list, and the plan's) until the archive ended, ~0.8 KB
    a member. Now only the plan's tree is kept, which for one name seen 10 000 times is one entry."""
    path = tmp_path / "a.tar"
    path.write_bytes(tar_of(*[member("d/", type=tarfile.DIRTYPE)] * 10_000))
    into = tmp_path / "into"
    into.mkdir()
    tracemalloc.start()
    try:
        if how == "file":
            untar.unpack(str(path), str(into), max_members=100_000, max_bytes=1)
        else:
            with open(path, "rb") as stream:
                untar.unpack(stream, str(into), max_members=100_000, max_bytes=1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"{peak} bytes at the peak for 10 000 members"
    assert [p.name for p in into.iterdir()] == ["d"]

"""Manifests, scanning beneath a root, the object store, export: no engine needed."""

import io
import os
import socket
import stat
import tarfile

import pytest

from quinebox.errors import ErrorKind
from quinebox.worlds import beneath, revisions
from quinebox.worlds.materialize import carry_out, exported
from quinebox.worlds.revisions import ObjectStore, RevisionLog, WorldError, apply, changes, describe, merge, scan, unkept_entries

F = {"type": "f", "mode": 0o644, "size": 1, "sha": "a" * 64, "mtime": 1}
G = {**F, "sha": "b" * 64}
D = {"type": "d", "mode": 0o755}
W = {"type": "w"}
L = {"type": "l", "target": "/etc"}


@pytest.mark.parametrize(
    "base, layer, expected",
    [
        ({}, {}, {}),
        ({"a": F}, {}, {"a": F}),
        ({"a": F}, {"a": G}, {"a": G}),
        ({"a": F}, {"a": W}, {}),
        ({"d": D, "d/x": F, "d/y": F}, {"d": D, "d/x": W}, {"d": D, "d/y": F}),
        ({"d": D, "d/x": F, "d/y": F}, {"d": {**D, "opaque": True}, "d/z": G}, {"d": D, "d/z": G}),  # rm -rf d; mkdir d
        ({"d": D, "d/x": F}, {"d": W}, {}),
        ({"d": D, "d/x": F}, {"d": F}, {"d": F}),  # a directory replaced by a file hides what was below
        ({"a": F}, {"a": L}, {"a": L}),
        ({"d": D, "d/e": D, "d/e/f": F}, {"d": D, "d/e": D, "d/e/g": G}, {"d": D, "d/e": D, "d/e/f": F, "d/e/g": G}),
        ({}, {"n": D, "n/x": F}, {"n": D, "n/x": F}),
    ],
)
def test_merge_shows_what_overlay_shows(base, layer, expected):
    assert merge(base, layer) == expected


@pytest.mark.parametrize(
    "old, new",
    [({}, {"a": F}), ({"a": F}, {}), ({"a": F, "d": D}, {"a": G, "d": D, "d/x": F}), ({"a": F}, {"a": L})],
)
def test_changes_apply_back_to_the_new_manifest(old, new):
    assert apply(old, changes(old, new)) == new


def test_describe_names_added_modified_and_deleted_paths_not_directory_modes():
    old = {"a": F, "b": F, "d": D}
    new = {"a": G, "c": F, "d": {**D, "mode": 0o700}}
    assert describe(old, changes(old, new)) == [("M", "a"), ("D", "b"), ("A", "c")]


def stored(store, tmp_path, data: bytes) -> str:
    """`data` in the store, the way a world's file gets there."""
    (tmp_path / "src").mkdir(exist_ok=True)
    (tmp_path / "src" / "f").write_bytes(data)
    fd = os.open(tmp_path / "src", beneath.DIR_FLAGS)
    try:
        sha, size = store.put(fd, "f")
    finally:
        os.close(fd)
    assert size == len(data)
    return sha


@pytest.fixture
def world(tmp_path):
    root = tmp_path / "world"
    root.mkdir()
    (root / "d").mkdir()
    (root / "d" / "file").write_bytes(b"hello")
    (tmp_path / "secret").write_bytes(b"host secret")
    os.symlink(tmp_path, root / "escape")
    os.symlink("/etc/passwd", root / "passwd")
    os.mkfifo(root / "fifo")
    (root / "suid").write_bytes(b"#!/bin/sh\n")
    os.chmod(root / "suid", 0o6755)
    return root


def test_scan_records_symlinks_as_links_and_never_goes_through_them(world, tmp_path):
    store = ObjectStore(tmp_path / "objects")
    manifest = scan(str(world), store)
    assert manifest["escape"] == {"type": "l", "target": str(tmp_path)}
    assert manifest["passwd"] == {"type": "l", "target": "/etc/passwd"}
    assert not any(p.startswith("escape/") for p in manifest)
    stored = {p.read_bytes() for p in (tmp_path / "objects").glob("??/*")}
    assert stored == {b"hello", b"#!/bin/sh\n"}  # the secret behind the link was never read


def test_scan_records_every_kind_of_entry_and_strips_setuid_and_setgid(world, tmp_path):
    if os.getuid() != 0:
        pytest.fail("this test makes a device node: run the suite as root, as CI does", pytrace=False)
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(world / "sock"))
    os.chmod(world / "sock", 0o710)
    os.mknod(world / "null", stat.S_IFCHR | 0o640, os.makedev(1, 3))
    os.mknod(world / "loop", stat.S_IFBLK | 0o600, os.makedev(7, 0))
    os.chmod(world / "fifo", 0o604)
    manifest = scan(str(world), ObjectStore(tmp_path / "objects"))
    assert manifest["fifo"] == {"type": "p", "mode": 0o604}
    assert manifest["sock"] == {"type": "s", "mode": 0o710}
    assert manifest["null"] == {"type": "c", "mode": 0o640, "rdev": os.makedev(1, 3)}
    assert manifest["loop"] == {"type": "b", "mode": 0o600, "rdev": os.makedev(7, 0)}
    assert manifest["suid"]["mode"] == 0o755
    assert unkept_entries(manifest) == ["loop (a device node, which quinebox never makes)", "null (a device node, which quinebox never makes)"]


def test_scan_reads_whiteouts_and_opaque_directories_only_in_an_overlay_layer(tmp_path):
    if os.getuid() != 0:
        pytest.fail("this test makes an overlay whiteout (a 0:0 character device): run the suite as root, as CI does", pytrace=False)
    layer = tmp_path / "upper"
    layer.mkdir()
    os.mknod(layer / "gone", stat.S_IFCHR | 0o600, os.makedev(0, 0))
    (layer / "d").mkdir()
    os.setxattr(layer / "d", revisions.OPAQUE, b"y")
    store = ObjectStore(tmp_path / "objects")
    assert scan(str(layer), store, layer=True) == {"gone": {"type": "w"}, "d": {"type": "d", "mode": 0o755, "opaque": True}}
    assert scan(str(layer), store) == {"gone": {"type": "c", "mode": 0o600, "rdev": 0}, "d": {"type": "d", "mode": 0o755}}


def test_files_over_the_size_cap_are_listed_but_not_read(tmp_path, monkeypatch):
    root = tmp_path / "w"
    root.mkdir()
    with open(root / "sparse", "wb") as f:
        f.truncate(1 << 40)  # a 1 TB sparse file: listed, never read
    (root / "big").write_bytes(b"x" * 100)
    monkeypatch.setenv("QUINEBOX_WORLD_MAX_FILE", "50")
    store = ObjectStore(tmp_path / "objects")
    manifest = scan(str(root), store)
    assert manifest["sparse"]["size"] == 1 << 40 and manifest["sparse"]["sha"] is None
    assert manifest["big"]["sha"] is None
    assert list((tmp_path / "objects").glob("??/*")) == []


def test_a_world_with_more_entries_than_the_cap_is_refused_not_read_to_the_end(tmp_path, monkeypatch):
    root = tmp_path / "w"
    root.mkdir()
    for i in range(150):
        (root / f"f{i}").write_bytes(b"")
    monkeypatch.setenv("QUINEBOX_WORLD_MAX_ENTRIES", "100")
    with pytest.raises(WorldError) as info:
        scan(str(root), ObjectStore(tmp_path / "objects"))
    assert (info.value.kind, dict(info.value.fields)) == (ErrorKind.LIMIT, {"limit": 100})


def test_unchanged_files_are_not_reread(tmp_path):
    root = tmp_path / "w"
    root.mkdir()
    (root / "a").write_bytes(b"one")
    store = ObjectStore(tmp_path / "objects")
    first = scan(str(root), store)
    os.unlink(store.path(first["a"]["sha"]))  # were it reread, it would be stored again
    assert scan(str(root), store, previous=first) == first
    assert not store.path(first["a"]["sha"]).exists()


@pytest.mark.parametrize("rel", ["", "/etc", "a/../../b", "..", "a/..", "x\0y"])
def test_world_paths_that_leave_the_root_are_refused(rel):
    with pytest.raises(beneath.Escape):
        beneath.parts(rel)


@pytest.mark.parametrize(
    "entry, kind, why",
    [
        ({"type": "p", "mode": 0o640}, stat.S_IFIFO, None),
        ({"type": "s", "mode": 0o700}, stat.S_IFSOCK, None),
        ({"type": "p", "mode": 0o000}, stat.S_IFIFO, None),
        ({"type": "c", "mode": 0o666, "rdev": os.makedev(1, 3)}, None, "a device node, which quinebox never makes"),
        ({"type": "b", "mode": 0o600, "rdev": os.makedev(7, 0)}, None, "a device node, which quinebox never makes"),
        ({"type": "f", "mode": 0o644, "size": 9, "sha": None, "mtime": 0}, None, "its bytes were not kept"),
    ],
)
def test_carrying_out_makes_fifos_and_sockets_anew_and_names_what_it_cannot_make(tmp_path, entry, kind, why):
    root = tmp_path / "w"
    root.mkdir()
    (root / "old").write_bytes(b"there before")
    fd = os.open(root, beneath.DIR_FLAGS)
    try:
        skipped = carry_out({"x": entry, "old": None}, ObjectStore(tmp_path / "objects"), fd)
    finally:
        os.close(fd)
    assert not (root / "old").exists()
    if why is None:
        st = os.lstat(root / "x")
        assert (skipped, stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode)) == ([], kind, entry["mode"])
    else:
        assert len(skipped) == 1 and skipped[0].startswith(f"x ({why}") and not os.path.lexists(root / "x")


def test_writing_a_tree_never_writes_through_a_planted_symlink(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    target = tmp_path / "target"
    target.mkdir()
    os.symlink(outside, target / "a")
    store = ObjectStore(tmp_path / "objects")
    sha = stored(store, tmp_path, b"payload")
    fd = os.open(target, beneath.DIR_FLAGS)
    try:
        with pytest.raises(beneath.Escape):
            carry_out({"a/x": {"type": "f", "mode": 0o644, "size": 7, "sha": sha, "mtime": 0}}, store, fd)
    finally:
        os.close(fd)
    assert list(outside.iterdir()) == []


def test_export_writes_exact_bytes_links_as_links_and_the_callers_ownership(tmp_path):
    store = ObjectStore(tmp_path / "objects")
    data = os.urandom(70000)
    manifest = {
        "d": {"type": "d", "mode": 0o750},
        "d/blob": {"type": "f", "mode": 0o600, "size": len(data), "sha": stored(store, tmp_path, data), "mtime": 10**18},
        "link": {"type": "l", "target": "/etc/passwd"},
        "huge": {"type": "f", "mode": 0o644, "size": 1 << 40, "sha": None, "mtime": 0},
        "fifo": {"type": "p", "mode": 0o640},
        "sock": {"type": "s", "mode": 0o755},
        "null": {"type": "c", "mode": 0o666, "rdev": os.makedev(1, 3)},
    }
    out = io.BytesIO()
    assert exported(manifest, store, out) == [
        "huge (its bytes were not kept: larger than QUINEBOX_WORLD_MAX_FILE, or unreadable when recorded)",
        "null (a device node, which quinebox never makes)",
        "sock (a socket, which a tar archive cannot hold)",
    ]
    with tarfile.open(fileobj=io.BytesIO(out.getvalue())) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert sorted(members) == ["d", "d/blob", "fifo", "link"]
        assert members["fifo"].isfifo() and members["fifo"].mode == 0o640
        assert tar.extractfile("d/blob").read() == data
        assert members["link"].issym() and members["link"].linkname == "/etc/passwd"
        assert {(m.uid, m.gid) for m in members.values()} == {(os.getuid(), os.getgid())}
        assert members["d/blob"].mode == 0o600


def test_a_revision_is_the_fold_of_its_base_and_its_changes(tmp_path):
    parent, child = RevisionLog("p-fold"), RevisionLog("c-fold")
    parent.append({"rev": 0, "changes": {"a": F}})
    parent.append({"rev": 1, "changes": {"a": G, "b": F}})
    child.append({"rev": 0, "base": {"session": "p-fold", "rev": 0}, "changes": {}})
    child.append({"rev": 1, "changes": {"c": F, "a": None}})
    assert parent.manifest(1) == {"a": G, "b": F}
    assert child.manifest(0) == {"a": F}
    assert child.manifest() == {"c": F}
    with pytest.raises(WorldError) as info:
        child.manifest(5)
    assert (info.value.kind, info.value.rev, info.value.last) == (ErrorKind.NOT_FOUND, 5, 1)



def test_a_file_growing_while_stored_is_kept_at_its_size_when_opened(tmp_path):
    """A box may append to a file for ever: the store reads what it held when opened, and says how much that was."""
    import threading

    store = ObjectStore(tmp_path / "objects")
    (tmp_path / "src").mkdir()
    grow = tmp_path / "src" / "f"
    grow.write_bytes(b"x" * (8 << 20))
    stop = threading.Event()

    def append():
        with open(grow, "ab") as f:
            while not stop.is_set():
                f.write(b"y" * 65536)

    writer = threading.Thread(target=append)
    writer.start()
    fd = os.open(tmp_path / "src", beneath.DIR_FLAGS)
    try:
        sha, size = store.put(fd, "f")
    finally:
        stop.set()
        writer.join()
        os.close(fd)
    assert size >= 8 << 20 and len(store.path(sha).read_bytes()) == size


def test_a_fifo_is_never_opened_into_the_store(world, tmp_path):
    store = ObjectStore(tmp_path / "objects")
    fd = os.open(world, beneath.DIR_FLAGS)
    try:
        with pytest.raises(beneath.Escape, match="not a regular file"):
            store.put(fd, "fifo")  # O_NONBLOCK: no writer, yet no wait
    finally:
        os.close(fd)

"""Choosing, making, revising and importing worlds on the host; no engine needed."""

import io
import os
import shutil
import socket
import stat
import tarfile
import threading
import time

import pytest

from quinebox.errors import ErrorKind, GrantError
from quinebox.state import state_dir
from quinebox.worlds import build
from quinebox.worlds.build import create, import_archive
from quinebox.worlds.revisions import ObjectStore, WorldError
from quinebox.worlds.spec import WorldSpec, child_world, root_world, world_dir
from quinebox.worlds.world import World

NOT_FOUND, BAD_INPUT, CONFLICT, REFUSED, LIMIT = ErrorKind.NOT_FOUND, ErrorKind.BAD_INPUT, ErrorKind.CONFLICT, ErrorKind.REFUSED, ErrorKind.LIMIT


def choose(cwd, **options):
    options = {"world": None, "world_from": None, "world_tar": None, **options}
    return root_world("s-choose", cwd=str(cwd), protected=[str(state_dir())], **options)


def test_a_box_at_the_host_gets_an_empty_world_of_its_own_by_default(tmp_path):
    spec = choose(tmp_path)
    assert spec == WorldSpec(kind="dir", layer=str(world_dir("s-choose") / "tree"))
    assert choose(tmp_path, world_from="empty") == spec


def test_world_dir_binds_the_real_directory(tmp_path):
    (tmp_path / "proj").mkdir()
    os.symlink(tmp_path / "proj", tmp_path / "link")
    assert choose(tmp_path, world="link") == WorldSpec(kind="bind", layer=str(tmp_path / "proj"))


@pytest.mark.parametrize(
    "options, kind, fields",
    [
        ({"world": "missing"}, NOT_FOUND, {"option": "--world", "path": "{tmp}/missing"}),
        ({"world": "file"}, BAD_INPUT, {"option": "--world", "path": "{tmp}/file"}),  # not a directory
        ({"world_from": "inherit"}, BAD_INPUT, {"option": "--world-from"}),  # a box started here has no parent world
        ({"world_from": ["missing"]}, NOT_FOUND, {"option": "--world-from", "path": "{tmp}/missing"}),
        ({"world_from": ["a/x", "b/x"]}, CONFLICT, {"option": "--world-from"}),  # both land on the same name
        ({"world": ".", "world_tar": "t.tar"}, BAD_INPUT, {"options": ["--world", "--world-tar"]}),
        ({"world_tar": "nope.tar"}, NOT_FOUND, {"option": "--world-tar", "path": "{tmp}/nope.tar"}),
    ],
)
def test_bad_world_choices_are_refused_with_what_to_do(tmp_path, options, kind, fields):
    (tmp_path / "file").write_text("")
    for d in ("a/x", "b/x"):
        (tmp_path / d).mkdir(parents=True)
    with pytest.raises(GrantError) as info:
        choose(tmp_path, **options)
    expected = {k: v.format(tmp=tmp_path) if isinstance(v, str) else v for k, v in fields.items()}
    assert (info.value.kind, dict(info.value.fields)) == (kind, expected)
    assert "\n" not in str(info.value)


def test_the_state_dir_can_never_be_a_world(tmp_path):
    for options in ({"world": str(state_dir())}, {"world_from": [str(state_dir())]}):
        with pytest.raises(GrantError) as info:
            choose(tmp_path, **options)
        assert (info.value.kind, info.value.path) == (REFUSED, str(state_dir()))


def make(session, **kw):
    spec = WorldSpec(kind="dir", layer=str(world_dir(session) / "tree"), **kw)
    create(session, spec, os.getuid(), os.getgid())
    return spec


@pytest.fixture
def parent():
    spec = make("u-parent-" + os.urandom(3).hex())
    session = spec.layer.split("/")[-3]
    root = spec.layer
    os.makedirs(f"{root}/src")
    open(f"{root}/src/a.py", "w").write("print('a')\n")
    open(f"{root}/README", "w").write("read me\n")
    world = World(session, spec)
    yield world
    world.close()


@pytest.mark.parametrize("paths", [["../etc"], ["/etc/passwd"], ["/world/../etc"], [""], ["src/missing"]])
def test_a_childs_world_paths_must_name_something_in_its_parents_world(parent, paths):
    with pytest.raises(GrantError) as info:
        child_world(parent, "u-child", paths)
    missing = paths == ["src/missing"]
    assert info.value.kind is (NOT_FOUND if missing else REFUSED)
    assert dict(info.value.fields) == ({"paths": ["src/missing"]} if missing else {"path": paths[0]})


def test_a_child_gets_only_the_paths_it_was_given(parent):
    spec = child_world(parent, "u-child-paths", ["/world/src"])
    create("u-child-paths", spec, os.getuid(), os.getgid())
    assert sorted(os.listdir(spec.layer)) == ["src"]
    assert open(f"{spec.layer}/src/a.py").read() == "print('a')\n"


def test_an_inheriting_child_stacks_its_layer_on_its_parents_at_the_revision_it_forked_from(parent):
    spec = child_world(parent, "u-child-cow", "inherit")
    assert spec.kind == "overlay" and spec.lowers == (parent.spec.layer,)
    assert spec.base == (parent.session, parent.rev)


def test_a_revision_holds_only_what_changed(parent):
    root = parent.spec.layer
    for i in range(2000):
        open(f"{root}/src/f{i}", "w").write(str(i))
    big = parent.revise("sh", turn=1, command="generate")
    assert big["files"] == 2000
    objects_before = set(ObjectStore().root.glob("??/*"))
    open(f"{root}/src/f7", "w").write("changed")
    small = parent.revise("sh", turn=2, command="edit one")
    assert small["changes"].keys() == {"src/f7"} and small["bytes"] == len("changed")
    assert len(set(ObjectStore().root.glob("??/*")) - objects_before) == 1
    assert parent.revise("sh", turn=3) is None  # nothing changed: no revision


def test_moves_and_deletions_of_whole_directories_are_revised_correctly(parent):
    root = parent.spec.layer
    os.makedirs(f"{root}/x/y")
    open(f"{root}/x/y/z", "w").write("z")
    parent.revise("sh")
    os.rename(f"{root}/x", f"{root}/moved")
    shutil.rmtree(f"{root}/src")
    record = parent.revise("sh")
    assert record["changes"] == {
        "x": None, "x/y": None, "x/y/z": None, "src": None, "src/a.py": None,
        "moved": parent.manifest["moved"], "moved/y": parent.manifest["moved/y"], "moved/y/z": parent.manifest["moved/y/z"],
    }
    assert sorted(parent.manifest) == ["README", "moved", "moved/y", "moved/y/z"]


def test_a_restore_plan_says_what_it_undoes_and_carries_the_old_bytes(parent):
    root = parent.spec.layer
    parent.revise("sh")
    first = parent.rev
    open(f"{root}/README", "w").write("rewritten\n")
    os.unlink(f"{root}/src/a.py")
    open(f"{root}/new", "w").write("new\n")
    plan, data = parent.restore_plan(first)
    assert plan["remove"] == ["new"]
    assert [f[0] for f in plan["files"]] == ["README", "src/a.py"]
    assert b"".join(data) == b"read me\nprint('a')\n"
    assert plan["undone"] == ["restored README", "removed new (made after revision 0)", "brought back src/a.py"]
    assert plan["before"] == first + 1  # the state being left is kept too


def make_entry(root, name, kind):
    """One entry of each kind a box can leave in its world."""
    path = f"{root}/{name}"
    if kind == "fifo":
        os.mkfifo(path, 0o640)
    elif kind == "socket":
        with socket.socket(socket.AF_UNIX) as listener:
            listener.bind(path)
    elif kind == "unreadable file":
        open(path, "w").write("mine\n")
        os.chmod(path, 0)
    elif kind == "unsearchable directory":
        os.mkdir(path)
        open(f"{path}/inside", "w").write("in\n")
        os.chmod(path, 0)
    elif kind == "device node":
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))


KINDS = ["fifo", "socket", "unreadable file", "unsearchable directory", "device node"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_restore_plan_removes_every_kind_of_entry_made_after_the_revision(parent, kind):
    if os.getuid() != 0 and kind == "device node":
        pytest.fail("this test makes a device node: run the suite as root, as CI does", pytrace=False)
    first = parent.rev
    make_entry(parent.spec.layer, "x", kind)
    plan, _ = parent.restore_plan(first)
    assert (plan["remove"], plan["lost"]) == (["x"], [])
    assert plan["undone"][0] == "removed x (made after revision 0)"


@pytest.mark.parametrize(
    "kind, step",
    [
        ("fifo", ("nodes", ["x", "p", 0o640])),
        ("socket", ("nodes", ["x", "s", 0o755])),
        ("unreadable file", ("files", ["x", 0, 5])),
        ("unsearchable directory", ("dirs", ["x", 0])),
        ("device node", ("lost", "x: a device node, which quinebox never makes")),
    ],
)
def test_a_restore_plan_brings_back_every_kind_of_entry_or_names_it_lost(parent, kind, step):
    if os.getuid() != 0 and kind == "device node":
        pytest.fail("this test makes a device node: run the suite as root, as CI does", pytrace=False)
    old = os.umask(0o022)
    try:
        make_entry(parent.spec.layer, "x", kind)
    finally:
        os.umask(old)
    then = parent.revise("sh")["rev"]
    shutil.rmtree(f"{parent.spec.layer}/x") if kind == "unsearchable directory" else os.unlink(f"{parent.spec.layer}/x")
    plan, _ = parent.restore_plan(then)
    field, wanted = step
    assert [item[: len(wanted)] if isinstance(wanted, list) else item for item in plan[field]][:1] == [wanted]
    assert ("brought back x" in plan["undone"]) == (kind != "device node")


def test_restoring_an_unknown_revision_is_refused(parent):
    with pytest.raises(WorldError) as info:
        parent.restore_plan(9)
    assert (info.value.kind, info.value.rev) == (NOT_FOUND, 9)


@pytest.fixture
def synced(monkeypatch):
    """The files fsynced meanwhile, by inode (each then fsynced for real; a log's first line is written under a name
    of its own, then renamed)."""
    inodes: list[int] = []
    real = os.fsync

    def fsync(fd):
        inodes.append(os.fstat(fd).st_ino)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return inodes


def test_a_world_made_empty_syncs_its_log_at_its_first_change_not_at_its_start(synced):
    """Rev 0 of an empty world goes unsynced (a world left empty is removed unread); the first revision fsyncs the
    log, rev 0 with it. A world that starts with files syncs its rev 0 at once: it records what the box was given."""
    session = "u-sync-" + os.urandom(3).hex()
    world = World(session, make(session))
    try:
        log = os.stat(world.log.path).st_ino
        assert (synced, [r["rev"] for r in world.log.records()]) == ([], [0])
        open(f"{world.spec.layer}/made", "w").write("by the box\n")
        assert world.revise("end")["changes"].keys() == {"made"}
        assert synced == [log] and [r["rev"] for r in world.log.records()] == [0, 1]
    finally:
        world.close()
    given = "u-sync-given-" + os.urandom(3).hex()
    spec = make(given)
    open(f"{spec.layer}/given", "w").write("for the box\n")
    started = World(given, spec)
    started.close()
    assert synced == [log, os.stat(started.log.path).st_ino] and started.log.records()[0]["changes"].keys() == {"given"}


def test_a_world_that_grows_past_its_grant_is_reported_once(tmp_path):
    spec = make("u-full")
    full = threading.Event()
    reasons = []
    world = World("u-full", spec, limit=1 << 20, on_full=lambda why: (reasons.append(why), full.set()))
    try:
        with open(f"{spec.layer}/sparse", "wb") as f:
            f.truncate(1 << 40)  # takes no blocks: not growth
        time.sleep(0.5)
        assert not full.is_set()
        with open(f"{spec.layer}/fat", "wb") as f:
            f.write(os.urandom(2 << 20))
        assert full.wait(5)
        assert len(reasons) == 1 and "over its world:1m grant" in reasons[0]
    finally:
        world.close()


def tar_of(*members):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def member(name, data=b"", **fields):
    info = tarfile.TarInfo(name)
    info.size = len(data) if data is not None else 0
    for key, value in fields.items():
        setattr(info, key, value)
    return info, data if fields.get("type", tarfile.REGTYPE) == tarfile.REGTYPE else None


@pytest.mark.parametrize(
    "members, message",
    [
        ([member("/etc/cron.d/x", b"x")], "absolute"),
        ([member("../escape", b"x")], "outside the destination"),
        ([member("a/../../escape", b"x")], "outside the destination"),
        ([member("link", type=tarfile.SYMTYPE, linkname="/etc"), member("link/passwd", b"x")], "link"),
        ([member("hard", type=tarfile.LNKTYPE, linkname="/etc/passwd")], "outside the destination|link"),
        ([member("dev", type=tarfile.CHRTYPE, devmajor=1, devminor=3)], "device file or FIFO"),
        ([member("pipe", type=tarfile.FIFOTYPE)], "device file or FIFO"),
    ],
)
def test_an_unsafe_archive_is_refused_whole_and_nothing_is_written(tmp_path, members, message):
    archive = tmp_path / "bad.tar"
    archive.write_bytes(tar_of(member("fine", b"ok"), *members))
    into = tmp_path / "into"
    into.mkdir()
    with pytest.raises(WorldError, match=message) as info:
        import_archive(str(archive), str(into))
    assert (info.value.kind, dict(info.value.fields)) == (REFUSED, {"archive": str(archive)})
    assert list(into.iterdir()) == []


def test_archive_caps_on_members_and_bytes_are_checked_before_anything_is_written(tmp_path, monkeypatch):
    archive = tmp_path / "many.tar"
    archive.write_bytes(tar_of(*(member(f"f{i}", b"x" * 10) for i in range(20))))
    into = tmp_path / "into"
    into.mkdir()
    monkeypatch.setattr(build, "MAX_ARCHIVE_MEMBERS", 10)
    with pytest.raises(WorldError) as info:
        import_archive(str(archive), str(into))
    assert (info.value.kind, dict(info.value.fields)) == (LIMIT, {"archive": str(archive)})
    monkeypatch.setattr(build, "MAX_ARCHIVE_MEMBERS", 1000)
    monkeypatch.setenv("QUINEBOX_WORLD_MAX_ARCHIVE", "100")
    with pytest.raises(WorldError) as info:
        import_archive(str(archive), str(into))
    assert (info.value.kind, dict(info.value.fields)) == (LIMIT, {"archive": str(archive)})
    assert list(into.iterdir()) == []


def test_a_safe_archive_lands_with_setuid_stripped_and_owned_by_the_caller(tmp_path):
    archive = tmp_path / "ok.tar"
    archive.write_bytes(tar_of(member("bin/tool", b"#!/bin/sh\n", mode=0o6755, uid=0, gid=0, uname="root"), member("link", type=tarfile.SYMTYPE, linkname="bin/tool")))
    into = tmp_path / "into"
    into.mkdir()
    import_archive(str(archive), str(into))
    st = os.stat(into / "bin" / "tool")
    assert (st.st_mode & 0o7777, st.st_uid) == (0o755, os.getuid())
    assert os.readlink(into / "link") == "bin/tool"


def test_a_failed_creation_leaves_no_world_behind(tmp_path):
    archive = tmp_path / "bad.tar"
    archive.write_bytes(tar_of(member("../x", b"x")))
    spec = WorldSpec(kind="dir", layer=str(world_dir("u-failed") / "tree"), archive=str(archive))
    with pytest.raises(WorldError):
        create("u-failed", spec, os.getuid(), os.getgid())
    assert not world_dir("u-failed").exists()

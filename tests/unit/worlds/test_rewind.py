"""A world no box runs in, brought back on the host to one of its revisions (a resumed session's): what the lost
turn left is kept as a revision first, the world is then exactly the revision's, and nothing is written through a
link the box planted."""

from __future__ import annotations

import os

import pytest

from quinebox.errors import ErrorKind
from quinebox.worlds.build import create
from quinebox.worlds.revisions import RevisionLog, WorldError, scan
from quinebox.worlds.rewind import rewind
from quinebox.worlds.spec import WorldSpec, world_dir
from quinebox.worlds.world import World, open_world


@pytest.fixture
def lost():
    """A session's world: revision 1 holds a/ and b; then its turn in flight changed it, unrecorded, and was lost."""
    session = "u-rewind-" + os.urandom(3).hex()
    spec = WorldSpec(kind="dir", layer=str(world_dir(session) / "tree"))
    create(session, spec, os.getuid(), os.getgid())
    world = World(session, spec)
    root = spec.layer
    os.makedirs(f"{root}/a")
    open(f"{root}/a/kept", "w").write("one\n")
    open(f"{root}/b", "w").write("bee\n")
    assert world.revise("sh", turn=1)["rev"] == 1
    world.close()
    open(f"{root}/a/kept", "w").write("changed by the lost turn\n")
    open(f"{root}/partial", "w").write("half done\n")
    os.remove(f"{root}/b")
    return session, spec


def files(root: str) -> dict[str, str]:
    found = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            found[os.path.relpath(path, root)] = open(path).read()
    return found


def test_the_world_is_made_as_it_was_and_its_history_keeps_what_the_lost_turn_did(lost):
    session, spec = lost
    assert rewind(session, 1) == []
    assert files(spec.layer) == {"a/kept": "one\n", "b": "bee\n"}
    records = RevisionLog(session).records()
    assert [(r["rev"], r["what"]) for r in records] == [(0, "start"), (1, "sh"), (2, "interrupted"), (3, "resume")]
    assert sorted(records[2]["changes"]) == ["a/kept", "b", "partial"]  # what the lost turn did, for `world diff`
    assert RevisionLog(session).manifest(3) == RevisionLog(session).manifest(1)


def test_the_box_that_goes_on_tracks_the_world_as_it_is_and_did_not_make_it(lost):
    session, spec = lost
    rewind(session, 1)
    world = open_world(session, spec, uid=os.getuid(), gid=os.getgid(), limit=1 << 30, on_full=lambda why: None)
    try:
        assert not world.made and world.rev == 3
        assert world.manifest == scan(spec.layer, world.store, world.manifest)
        open(f"{spec.layer}/new", "w").write("after\n")
        assert world.revise("sh", turn=2)["changes"].keys() == {"new"}
    finally:
        world.close()


def test_a_world_unchanged_since_the_revision_takes_no_revision(lost):
    session, spec = lost
    rewind(session, 1)
    assert rewind(session, 1) == [] and len(RevisionLog(session).records()) == 4


def test_a_link_the_lost_turn_planted_is_replaced_never_written_through(lost, tmp_path):
    session, spec = lost
    outside = tmp_path / "outside"
    outside.mkdir()
    os.rename(f"{spec.layer}/a", f"{spec.layer}/a-moved")
    os.symlink(outside, f"{spec.layer}/a")
    rewind(session, 1)
    assert os.listdir(outside) == []
    assert not os.path.islink(f"{spec.layer}/a") and files(spec.layer) == {"a/kept": "one\n", "b": "bee\n"}


def test_a_layer_over_a_parents_world_is_not_brought_back_on_the_host(tmp_path):
    session = "u-rewind-overlay-" + os.urandom(3).hex()
    here = world_dir(session)
    here.mkdir(parents=True)
    (here / "meta.json").write_text('{"session": "x", "kind": "overlay", "layer": "/nowhere", "lowers": [], "work": null, "base": null}')
    with pytest.raises(WorldError) as info:
        rewind(session, 0)
    assert (info.value.kind, dict(info.value.fields)) == (ErrorKind.UNSUPPORTED, {"session": session})

"""Snapshots as they lie in the state dir (box/live/snapshots.py): sealed manifests, file digests, whose they are."""

import json
import os

import pytest

from quinebox.box.live import snapshots
from quinebox.box.live.snapshots import MAKER, Recipe, Snapshot, seal, unseal
from quinebox.errors import QuineboxError

RECIPE = Recipe(image="quinebox/agent:0.1.0", image_id="sha256:aa", agent_id="sha256:aa", grants=("mem:512m",))
KEY = b"k" * 32


def manifest(**changed) -> Snapshot:
    return Snapshot(**{"id": "abc123def456", "uid": os.getuid(), "box": "0123456789ab", "made_by": "h:1:2", "created": 1.0, "recipe": RECIPE,
                       "files": {"image/checkpoint.img": "00 644"}, "size": 10, **changed})


@pytest.fixture(autouse=True)
def own_state(tmp_path, monkeypatch):
    monkeypatch.setenv("QUINEBOX_STATE_DIR", str(tmp_path / "state"))


def test_a_sealed_manifest_reads_back_as_it_was():
    assert unseal(json.loads(json.dumps(seal(manifest(), KEY))), KEY, "s") == manifest()


@pytest.mark.parametrize(
    "change, said",
    [
        (lambda m: {**m, "size": 11}, "snapshot s is not as it was made: its manifest was changed (or sealed under another key); it is refused"),
        (lambda m: {**m, "recipe": {**m["recipe"], "grants": ["rw:/"]}}, "snapshot s is not as it was made: its manifest was changed"),
        (lambda m: {**m, "files": {}}, "snapshot s is not as it was made: its manifest was changed"),
        (lambda m: {**m, "uid": 4242}, "snapshot s was made by another user (uid 4242): only they may use it"),
        (lambda m: {k: v for k, v in m.items() if k != "seal"}, "snapshot s has no sealed manifest: it was not made by quinebox, or not finished"),
        (lambda m: [m], "snapshot s has no sealed manifest"),
        (lambda m: None, "snapshot s has no sealed manifest"),
    ],
)
def test_a_changed_manifest_or_another_users_is_refused(change, said):
    with pytest.raises(QuineboxError) as refused:
        unseal(change(seal(manifest(), KEY)), KEY, "s")
    assert str(refused.value).startswith(said)


def test_another_key_is_refused_and_so_is_another_format():
    with pytest.raises(QuineboxError, match="its manifest was changed"):
        unseal(seal(manifest(), KEY), b"x" * 32, "s")
    with pytest.raises(QuineboxError, match=r"made by another version of quinebox \(its format 9, this one's 1\)"):
        unseal(seal(manifest(version=9), KEY), KEY, "s")


def made(world: dict[str, bytes] | None = None, **facts) -> Snapshot:
    snapshot, making = snapshots.start()
    (making / "image").mkdir()
    (making / "image" / "checkpoint.img").write_bytes(b"memory")
    if world is not None:
        (making / "world").mkdir()
        for name, data in world.items():
            (making / "world" / name).write_bytes(data)
        os.symlink("/etc/passwd", making / "world" / "link")
    return snapshots.commit(making, manifest(id=snapshot, files={}, size=0, **facts))


def test_a_snapshot_is_found_by_the_start_of_its_id_and_checked_whole():
    snapshot = made({"a": b"1"})
    assert set(snapshot.files) == {"image", "image/checkpoint.img", "world", "world/a", "world/link"}
    assert snapshot.size == len(b"memory") + 1 + len("/etc/passwd")
    assert snapshots.find(snapshot.id[:4]) == snapshot and snapshots.listing() == [snapshot]
    snapshots.verify(snapshot)
    assert oct(snapshot.path.stat().st_mode & 0o777) == "0o700"


@pytest.mark.parametrize(
    "tamper, said",
    [
        (lambda p: (p / "world" / "a").write_bytes(b"2"), "world/a was changed"),
        (lambda p: (p / "world" / "a").chmod(0o4755), "world/a was changed"),
        (lambda p: (p / "world" / "b").write_bytes(b""), "world/b was added"),
        (lambda p: (p / "image" / "checkpoint.img").unlink(), "image/checkpoint.img is missing"),
        (lambda p: ((p / "world" / "link").unlink(), os.symlink("/", p / "world" / "link")), "world/link was changed"),
    ],
)
def test_a_changed_file_is_named_and_refused(tamper, said):
    snapshot = made({"a": b"1"})
    tamper(snapshot.path)
    with pytest.raises(QuineboxError, match=rf"^snapshot {snapshot.id} is not as it was made: {said}; it is refused$"):
        snapshots.verify(snapshots.find(snapshot.id))


def test_a_fifo_is_no_snapshots():
    snapshot = made({"a": b"1"})
    os.mkfifo(snapshot.path / "world" / "fifo")
    with pytest.raises(QuineboxError, match="holds world/fifo, which is no file, link or directory: it is refused"):
        snapshots.verify(snapshot)


def test_no_snapshot_or_more_than_one_is_said_in_one_line(monkeypatch):
    with pytest.raises(QuineboxError, match=r"^no snapshot has an id starting 'zz': `quinebox box snapshots` lists them$"):
        snapshots.find("zz")
    ids = iter(["ab0000000001", "ab0000000002"])
    monkeypatch.setattr(snapshots, "new_session_id", lambda: next(ids))
    made(), made()
    with pytest.raises(QuineboxError, match=r"^more than one snapshot has an id starting 'ab'"):
        snapshots.find("ab")
    assert snapshots.find("ab0000000002").id == "ab0000000002"


def test_gc_sweeps_what_was_left_half_made_or_a_gone_forks_and_keeps_the_rest():
    gone = f"{os.uname().nodename}:999999999:1"  # no such process here
    kept = made()
    running_fork = made(transient=True)  # made_by h:1:2, another host's: counted as alive
    gone_fork = made(transient=True, made_by=gone)
    _, being_made = snapshots.start()
    _, left_half_made = snapshots.start()
    (left_half_made / MAKER).write_text(gone)
    assert sorted(snapshots.sweep()) == sorted([gone_fork.id, left_half_made.name.removesuffix(".making")])
    assert {s.id for s in snapshots.listing()} == {kept.id, running_fork.id} and being_made.exists() and not left_half_made.exists()

"""`quinebox prune`: which sessions go (a pure function, table-tested), and what a prune of a real state dir
takes and leaves: tapes, worlds, world objects, run records, tombstones, the audit log. Sessions here are
made by the real store (index, tapes, worlds) with no box; the CLI's prune of boxes' sessions is e2e."""

import contextlib
import errno
import os
import subprocess
import sys
import time

import pytest
from stored import DAY, NOW, data, objects, row, session, sha

from quinebox.agent.store import Index
from quinebox.agent.tapes import find
from quinebox.audit.log import AuditLog, verify
from quinebox.errors import ErrorKind, QuineboxError
from quinebox.state import run_dir, session_dir, tree_bytes
from quinebox.tree.prune import Rules, RulesError, Stayed, choose, prune
from quinebox.tree.runs import RunRecord
from quinebox.worlds.build import create
from quinebox.worlds.spec import WorldSpec, child_world, world_dir
from quinebox.worlds.world import World


def ids(rows):
    return [r.id for r in rows]


@pytest.mark.parametrize(
    "rules, rows, held, needs, going",
    [
        # --older-than counts from when a session ended
        (Rules(older_than=7 * DAY), [row("a", ended=NOW - 8 * DAY), row("b", ended=NOW - 6 * DAY)], (), {}, ["a"]),
        (Rules(older_than=7 * DAY), [row("a", ended=NOW - 7 * DAY)], (), {}, ["a"]),
        # never a session not ended: running, waiting, or its owner died before it could end it
        (Rules(older_than=1), [row("a", ended=None, started=NOW - 99 * DAY)], (), {}, []),
        # --keep N keeps the newest N finished sessions, by start
        (Rules(keep=1), [row("old", started=NOW - 3 * DAY), row("new", started=NOW - DAY)], (), {}, ["old"]),
        (Rules(keep=0), [row("a"), row("b")], (), {}, ["a", "b"]),
        (Rules(keep=5), [row("a"), row("b")], (), {}, []),
        (Rules(keep=1), [row("run", ended=None, started=NOW), row("x", started=NOW - 2 * DAY), row("y", started=NOW - DAY)], (), {}, ["x"]),
        # --failed / --succeeded by exit status
        (Rules(outcome="failed"), [row("ok", exit_code=0), row("bad", exit_code=1), row("killed", exit_code=137)], (), {}, ["bad", "killed"]),
        (Rules(outcome="succeeded"), [row("ok", exit_code=0), row("bad", exit_code=1)], (), {}, ["ok"]),
        # every rule given must hold
        (Rules(older_than=7 * DAY, outcome="failed"), [row("a", exit_code=1, ended=NOW - DAY), row("b", exit_code=1), row("c")], (), {}, ["b"]),
        # held: a live box, a lasting box, a pending approval, an unfinished run
        (Rules(older_than=1), [row("a"), row("b")], {"a"}, {}, ["b"]),
        # what stays keeps its parent, and its parent's parent
        (Rules(outcome="failed"), [row("root", exit_code=1), row("mid", exit_code=1, parent="root"), row("leaf", exit_code=0, parent="mid")], (), {}, []),
        (Rules(outcome="failed"), [row("root", exit_code=0), row("kid", exit_code=1, parent="root")], (), {}, ["kid"]),
        (Rules(older_than=1), [row("root"), row("kid", parent="root", ended=None)], (), {}, []),
        # what stays keeps the worlds it reads: a fork's source, an overlay's lowers, and theirs
        (Rules(outcome="failed"), [row("src", exit_code=1), row("fork", exit_code=0)], (), {"fork": {"src"}}, []),
        (Rules(outcome="failed"), [row("a", exit_code=1), row("b", exit_code=1), row("c")], (), {"c": {"b"}, "b": {"a"}}, []),
        # an exec's world, in no index row, keeps what it reads too
        (Rules(older_than=1), [row("src")], (), {"exec-world": {"src"}}, []),
        # going together, both go
        (Rules(older_than=1), [row("src"), row("fork")], (), {"fork": {"src"}}, ["src", "fork"]),
    ],
)
def test_which_sessions_go(rules, rows, held, needs, going):
    assert sorted(ids(choose(rows, rules, now=NOW, held=held, needs=needs))) == sorted(going)


def test_the_sessions_that_go_come_oldest_first():
    rows = [row("c", started=NOW - DAY), row("a", started=NOW - 3 * DAY), row("b", started=NOW - 2 * DAY)]
    assert ids(choose(rows, Rules(keep=0), now=NOW)) == ["a", "b", "c"]


@pytest.mark.parametrize(
    "fields, message",
    [
        ({}, "say which sessions to prune: --older-than DURATION, --keep N, --failed or --succeeded (--dry-run lists them first)"),
        ({"keep": -1}, "--keep -1: give how many of the newest sessions to keep, 0 or more"),
        ({"outcome": "maybe"}, "bad outcome 'maybe': failed or succeeded"),
    ],
)
def test_rules_that_name_nothing_or_name_it_wrongly_are_usage_errors(fields, message):
    with pytest.raises(RulesError) as raised:
        Rules(**fields)
    assert str(raised.value) == message and raised.value.exit_code == 2  # the wording is the point: a usage line
    assert raised.value.kind is ErrorKind.BAD_INPUT


# -- a real state dir ---------------------------------------------------------------------------


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("QUINEBOX_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("QUINEBOX_AUDIT", raising=False)
    return tmp_path / "state"


def test_a_prune_takes_old_sessions_their_worlds_and_the_objects_only_they_named(state):
    session("s-old", {"only-old": b"old bytes", "shared": b"shared bytes"})
    session("s-new", {"shared": b"shared bytes", "only-new": b"new bytes"}, age=0)
    assert objects(state) == {sha(b"old bytes"), sha(b"shared bytes"), sha(b"new bytes")}
    done = prune(Rules(older_than=7 * DAY))
    assert [r.id for r, _ in done.sessions] == ["s-old"] and done.session_bytes > 0
    assert (done.objects.objects, done.objects.bytes) == (1, len(b"old bytes"))
    assert not session_dir("s-old").exists() and session_dir("s-new").exists()
    assert objects(state) == {sha(b"shared bytes"), sha(b"new bytes")}
    index = Index()
    assert [r.id for r in index.every()] == ["s-new"]
    index.close()
    with pytest.raises(QuineboxError, match=r"^session s-old was pruned at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \(`quinebox prune`\): its tape and world are gone$"):
        find("s-old")
    assert find("s-new").id == "s-new"


def test_a_dry_run_says_the_same_and_removes_nothing(state):
    session("s-a", {"a": b"aaa"})
    session("s-b", {"b": b"bbbb"})
    before = data(state)
    dry = prune(Rules(older_than=DAY), dry=True)
    assert data(state) == before
    real = prune(Rules(older_than=DAY))
    assert [(r.id, size) for r, size in dry.sessions] == [(r.id, size) for r, size in real.sessions]
    assert (dry.objects.objects, dry.objects.bytes) == (real.objects.objects, real.objects.bytes) == (2, 7)


def test_the_audit_log_verifies_after_a_prune_and_records_what_went_and_by_whom(state):
    session("s-a", {"a": b"aaa"})
    prune(Rules(keep=0))
    assert verify().intact
    records = [r for r in AuditLog().records() if r["kind"] in ("prune", "pruned")]
    assert [r["kind"] for r in records] == ["prune", "pruned"]
    said = records[0]["facts"]
    assert (said["sessions"], said["ids"], said["rules"], said["by"]["uid"]) == (1, ["s-a"], {"keep": 0}, os.getuid())
    assert records[1]["facts"]["objects"] == 1


def test_an_open_world_keeps_what_it_has_put_and_not_yet_named(state):
    session("s-old", {"f": b"the same bytes"})
    spec = WorldSpec(kind="dir", layer=str(world_dir("s-live") / "tree"))
    create("s-live", spec, os.getuid(), os.getgid())
    live = World("s-live", spec, track=False)  # its lease begins
    try:
        time.sleep(0.05)
        (world_dir("s-live") / "tree" / "f").write_bytes(b"the same bytes")
        (world_dir("s-live") / "tree" / "g").write_bytes(b"fresh bytes")
        live.layer = live._scan(previous={})  # put, as a box's change is, before any revision names it
        prune(Rules(keep=0))
        assert not session_dir("s-old").exists()
        assert {sha(b"the same bytes"), sha(b"fresh bytes")} <= objects(state)  # the first was named only by s-old
        assert live.revise("end") is not None
    finally:
        live.close()
    assert os.listdir(state / "objects" / "leases") != []  # its lease, unheld, goes at the next sweep
    prune(Rules(keep=0))
    assert os.listdir(state / "objects" / "leases") == []
    assert {sha(b"the same bytes"), sha(b"fresh bytes")} <= objects(state)  # named by s-live's revision now


def test_what_something_live_still_has_stays(state):
    for name in ("s-box", "s-lasting", "s-mapped", "s-parent", "s-src", "s-free"):
        session(name, {name: name.encode()})
    session("s-child", {}, ended=False, parent="s-parent")
    run = run_dir()
    (run / "s-box.sock").write_bytes(b"")  # a box's socket
    (run / "sandboxes").mkdir()
    (run / "sandboxes" / "s-lasting.json").write_text("{}")
    record = RunRecord("map", "m", state)
    record.begin([], set())
    record.attempt("one", "in/one", "s-mapped")  # the run has not ended: a --resume may need it
    spec = child_world(World("s-src", WorldSpec(kind="dir", layer=str(world_dir("s-src") / "tree")), track=False), "x-exec", "inherit")
    create("x-exec", spec, os.getuid(), os.getgid())  # an exec's world, no index row, reading s-src's layer
    done = prune(Rules(older_than=1))
    assert [r.id for r, _ in done.sessions] == ["s-free"]
    assert sorted(os.listdir(state / "sessions")) == ["s-box", "s-child", "s-lasting", "s-mapped", "s-parent", "s-src", "x-exec"]
    record.end(0)
    assert [r.id for r, _ in prune(Rules(older_than=1)).sessions] == ["s-mapped"]
    assert prune(Rules(older_than=1)).runs == 0 and not (state / "runs" / record.id).exists()


def test_a_run_record_goes_once_its_run_ended_and_its_sessions_are_gone(state):
    session("s-1", {})
    session("s-2", {}, age=0)
    record = RunRecord("batch", "m", state)
    record.begin([], set())
    record.attempt("one", "in/one", "s-1")
    record.attempt("two", "in/two", "s-2")
    record.end(0)
    assert prune(Rules(older_than=DAY)).runs == 0 and (state / "runs" / record.id).exists()
    assert prune(Rules(keep=0)).runs == 1 and not (state / "runs" / record.id).exists()


@contextlib.contextmanager
def unremovable(directory):
    """Nothing in `directory` can be removed, whoever runs the tests: as root, whom no mode stops, it is a
    read-only bind mount of itself; as another user (CI's rootless pass), it loses its write permission.
    Yields the reason a removal in it fails with."""
    if os.geteuid() == 0:
        subprocess.run(["mount", "--bind", str(directory), str(directory)], check=True)
        try:
            subprocess.run(["mount", "-o", "remount,bind,ro", str(directory)], check=True)
            yield os.strerror(errno.EROFS)
        finally:
            subprocess.run(["umount", str(directory)], check=True)
    else:
        directory.chmod(0o555)
        try:
            yield os.strerror(errno.EACCES)
        finally:
            directory.chmod(0o755)


def test_a_session_dir_that_cannot_be_removed_whole_is_said_counts_nothing_it_kept_and_goes_at_a_later_prune(state, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # no retention of the user's config starts here
    session("s-stuck", {"a": b"aaa"})
    path = session_dir("s-stuck")
    stuck = world_dir("s-stuck") / "tree" / "ro"
    stuck.mkdir()
    (stuck / "f").write_bytes(b"s" * 2000)
    held = tree_bytes(path)
    quinebox = os.path.join(os.path.dirname(sys.executable), "quinebox")
    with unremovable(stuck) as reason:
        done = subprocess.run([quinebox, "prune", "--keep", "0"], capture_output=True, timeout=120)
        why = f"cannot remove {stuck / 'f'}: {reason}"
        assert (done.returncode, done.stdout, done.stderr.decode()) == (
            0,
            b"",
            f"quinebox: session s-stuck is pruned, but 2.0 kB of {path} stay: {why}; the next prune tries again\n"
            f"quinebox: pruned 1 session(s), {(held - 2000) / 1e3:.1f} kB; 1 world object(s), 0.0 kB; 0 run record(s); 0 unpacked image(s), 0.0 kB\n",
        )
        assert sorted(str(p.relative_to(path)) for p in path.rglob("*")) == ["world", "world/tree", "world/tree/ro", "world/tree/ro/f"]
        with pytest.raises(QuineboxError) as gone:
            find("s-stuck")
        assert (gone.value.kind, gone.value.session, gone.value.pruned) == (ErrorKind.NOT_FOUND, "s-stuck", "s-stuck")
        said = [r["facts"] for r in AuditLog().records() if r["kind"] in ("prune", "pruned")]
        assert (said[0]["bytes"], said[1]["stayed"]) == (held, [{"session": "s-stuck", "path": str(path), "why": why, "bytes": 2000}])
        again = prune(Rules(keep=0))  # still stuck: said again, as nothing freed
        assert (again.sessions, again.stayed) == ([], [Stayed("s-stuck", str(path), why, 2000)])
    assert verify().intact
    last = prune(Rules(keep=0))
    assert (last.sessions, last.stayed) == ([], []) and not path.exists()


def test_a_second_prune_at_once_is_refused_in_one_line(state):
    import fcntl

    state.mkdir(parents=True, exist_ok=True)
    with open(state / "prune.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(QuineboxError) as busy:
            prune(Rules(keep=0))
        assert (busy.value.kind, dict(busy.value.fields)) == (ErrorKind.CONFLICT, {"state_dir": str(state)})
        assert "\n" not in str(busy.value)


def test_objects_of_a_store_with_nothing_to_prune_stay(state):
    session("s-a", {"a": b"a"}, age=0)
    before = objects(state)
    done = prune(Rules(older_than=DAY))
    assert (done.sessions, done.objects.objects, objects(state)) == ([], 0, before)
    assert not [r for r in AuditLog().records() if r["kind"] in ("prune", "pruned")]  # nothing went: nothing to record


def test_tree_bytes_weighs_a_directory_a_file_and_nothing(tmp_path):
    (tmp_path / "d" / "e").mkdir(parents=True)
    (tmp_path / "d" / "a").write_bytes(b"x" * 10)
    (tmp_path / "d" / "e" / "b").write_bytes(b"y" * 5)
    assert tree_bytes(tmp_path / "d") == 15
    os.link(tmp_path / "d" / "a", tmp_path / "d" / "e" / "a-again")  # one file, as an unpacked image links them
    (tmp_path / "d" / "e" / "to-a").symlink_to("../a")
    assert tree_bytes(tmp_path / "d") == 15 + len("../a")
    assert tree_bytes(tmp_path / "d" / "a") == 10  # sessions.db beside the sessions is weighed so
    assert tree_bytes(tmp_path / "gone") == 0

"""Worlds on the real engine: copy-on-write children, adopt, restore_world, fork --at, limits, and what is left behind."""

import base64
import io
import json
import os
import pwd
import tarfile
import textwrap

import pytest
from commands import qb, scripts
from openai_server import exit_, sh, tool

import quinebox
from quinebox.agent.store import read_tape
from quinebox.audit.log import AuditLog
from quinebox.box.backends.oci import idmap
from quinebox.box.policy import LABEL_SESSION
from quinebox.box.spec import AGENT_UID
from quinebox.state import session_dir
from quinebox.worlds.revisions import RevisionLog

TREE = ["-g", "spawn:4", "-g", "depth:1"]


def run_script(tmp_path, turns, *args, input=b""):
    scripts(tmp_path, mission=turns)
    done = qb("run", "-q", "--json", "-m", f"script:{tmp_path / 'mission.yaml'}", *args, "the mission", input=input)
    summary = json.loads(done.stderr.decode().splitlines()[-1])
    return done, summary["session"]


def children_of(session):
    return [r["child"] for r in read_tape(session) if r["kind"] == "spawn"]


def exported(session, rev=None):
    done = qb("world", "export", session, *([str(rev)] if rev is not None else []))
    assert done.returncode == 0, done.stderr
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
        return {m.name: (tar.extractfile(m).read() if m.isfile() else m) for m in tar.getmembers()}


def test_children_see_their_parents_world_and_their_writes_stay_their_own(tmp_path):
    first = "quinebox exec -- sh -c 'echo one > /world/a.txt; echo 1 > /world/s1; rm /world/gone; ls /world'"
    second = "quinebox exec -- sh -c 'cat /world/a.txt; echo 2 > /world/s2; ls /world'"
    done, session = run_script(
        tmp_path,
        [{"sh": "echo parent > a.txt; echo p > gone"}, {"sh": f"{first} >&4; {second} >&4; echo --- >&4; ls >&4; cat a.txt >&4"}, {"exit": "success"}],
        *TREE,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"a.txt\ns1\nparent\na.txt\ngone\ns2\n---\na.txt\ngone\nparent\n"
    one, two = children_of(session)
    assert exported(one)["a.txt"] == b"one\n" and "gone" not in exported(one)
    assert exported(two)["a.txt"] == b"parent\n" and "s1" not in exported(two)
    assert exported(session)["a.txt"] == b"parent\n"


def test_a_child_can_get_an_empty_world_or_only_the_paths_it_is_given(tmp_path):
    done, _ = run_script(
        tmp_path,
        [{"sh": "mkdir -p src/deep; echo x > src/deep/f; echo s > secret"}, {"sh": "quinebox exec --world-from empty -- ls -A /world >&4; echo --- >&4; quinebox exec --world-from src/deep -- find /world >&4"}, {"exit": "success"}],
        *TREE,
    )
    assert done.stdout == b"---\n/world\n/world/src\n/world/src/deep\n/world/src/deep/f\n"


def test_adopt_merges_a_childs_exact_bytes_and_refuses_a_conflict_unless_forced(tmp_path):
    child = "quinebox exec -- sh -c 'head -c 300000 /dev/urandom > /world/blob; echo child > /world/a.txt; rm /world/keep; mkdir /world/new'"
    done, session = run_script(
        tmp_path,
        [{"sh": "echo parent > a.txt; echo k > keep"}, {"sh": child}, {"sh": "echo parent-again > a.txt"}, {"exit": "success"}],
        *TREE,
    )
    assert done.returncode == 0, done.stderr
    [kid] = children_of(session)
    blob = exported(kid)["blob"]
    assert len(blob) == 300000
    refused = qb("world", "adopt", kid)
    assert refused.returncode == 1 and b"its parent changed a.txt too since the fork; --force" in refused.stderr
    assert exported(session)["a.txt"] == b"parent-again\n"  # nothing was changed by the refusal
    forced = qb("world", "adopt", "--force", kid)
    assert forced.returncode == 0, forced.stderr
    assert forced.stdout.decode().split("\n") == ["M a.txt", "A blob", "D keep", "A new", ""]
    world = session_dir(session) / "world" / "tree"
    assert (world / "blob").read_bytes() == blob and (world / "a.txt").read_text() == "child\n" and not (world / "keep").exists()
    owner = json.loads((session_dir(session) / "world" / "meta.json").read_text())["uid"]  # the box's user's host uid
    assert os.stat(world / "blob").st_uid == owner and owner == (os.getuid() or owner)
    assert RevisionLog(session).records()[-1]["what"] == f"adopt {kid}"
    [adopted] = [r["facts"] for r in AuditLog().records() if r["kind"] == "world_adopted" and r["session"] == session]
    assert (adopted["child"], adopted["by"], adopted["force"], adopted["changes"]) == (kid, "host", True, 4)


def test_a_race_may_adopt_its_winners_world(tmp_path):
    scripts(tmp_path, winner=[{"sh": "echo won > a.txt; echo new > b.txt"}, {"exit": "success"}], loser=[{"sh": "sleep 60"}, {"exit": "success"}])
    race = {"mode": "race", "adopt": True, "children": [{"mission": "win", "model": "script:winner.yaml"}, {"mission": "lose", "model": "script:loser.yaml"}]}
    done, _ = run_script(tmp_path, [{"sh": "echo base > a.txt"}, {"fork": race}, {"sh": "cat a.txt b.txt >&4"}, {"exit": "success"}], *TREE)
    assert (done.returncode, done.stdout) == (0, b"won\nnew\n")


def test_restore_world_rolls_files_back_and_the_model_keeps_its_conversation(fake_openai):
    fake_openai.steps = [
        sh("echo v1 > f; printf '\\000\\001' > bin"),
        sh("echo v2 > f; rm bin; echo junk > g"),
        tool("restore_world", {"revision": 1}),
        sh("cat f >&4; od -An -tx1 bin >&4; ls >&4"),
        exit_(),
    ]
    result = quinebox.run("work, then undo")
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"v1\n 00 01\nbin\nf\n"
    after = fake_openai.requests[3].body["messages"]
    contents = [m.get("content") or "" for m in after]
    assert any("[world revision 1:" in c for c in contents) and any("[world revision 2:" in c for c in contents)
    restored = contents[-1]
    assert "/world is back at revision 1" in restored
    assert "Undone: brought back bin; restored f; removed g (made after revision 1)" in restored
    assert [m["role"] for m in after][:2] == ["system", "user"] and len(after) == 8  # every earlier turn is still there
    log = RevisionLog(result.session).records()
    assert [r.get("command") for r in log[-1:]] == ["restore_world 1"]
    [restored] = [r["facts"] for r in AuditLog().records() if r["kind"] == "world_restored" and r["session"] == result.session]
    assert (restored["revision"], restored["before"], restored["by"]) == (1, 2, "box")


def test_restore_world_streams_files_larger_than_a_frame_byte_for_byte(fake_openai):
    fake_openai.steps = [
        sh("head -c 3500000 /dev/urandom > big; head -c 1500000 /dev/urandom > big2; sha256sum big big2 > /tmp/sums"),
        sh("rm big; echo small > big2"),
        tool("restore_world", {"revision": 1}),
        sh("sha256sum -c /tmp/sums >&4"),
        exit_(),
    ]
    result = quinebox.run("lose big files, then get them back")
    assert (result.returncode, result.stdout) == (0, b"big: OK\nbig2: OK\n"), result.stderr


def test_fork_at_a_turn_starts_from_that_turns_world_and_conversation(tmp_path, fake_openai):
    _, original = run_script(tmp_path, [{"sh": "echo 1 > n"}, {"sh": "echo 2 >> n"}, {"sh": "echo 3 >> n"}, {"exit": "success"}])
    fake_openai.steps = [sh("cat n >&4"), exit_()]
    done = qb("fork", original[:8], "--at", "3", "--mission", "print n", "-q", "--json")
    assert (done.returncode, done.stdout) == (0, b"1\n2\n"), done.stderr
    forked = json.loads(done.stderr.decode().splitlines()[-1])["session"]
    meta = read_tape(forked)[0]
    assert meta["forked_from"] == {"session": original, "turn": 3, "revision": 2}
    assert f"forked    from {original} at turn 3 (world revision 2)" in qb("show", forked).stdout.decode()
    first = fake_openai.requests[0].body["messages"]
    assert [c["function"]["arguments"] for m in first for c in m.get("tool_calls") or []] == ['{"command": "echo 1 > n"}', '{"command": "echo 2 >> n"}']
    assert first[-1] == {"role": "user", "content": "New instructions from here on:\n\nprint n"}
    assert exported(original)["n"] == b"1\n2\n3\n"  # the original is untouched


def test_fork_at_a_turn_that_was_never_taken_says_which_there_are(tmp_path):
    _, original = run_script(tmp_path, [{"exit": "success"}])
    done = qb("fork", original, "--at", "7")
    assert done.returncode == 125 and f"session {original} has no turn 7: it made 1 model call(s), turns 1 to 1".encode() in done.stderr


def test_a_box_that_grows_its_world_past_its_grant_is_killed(tmp_path):
    done = qb("exec", "-g", "world:5m", "--", "sh", "-c", "head -c 50000000 /dev/zero > /world/big; sleep 30")
    assert done.returncode == 137
    assert b"over its world:5m grant; the box was killed" in done.stderr


def test_a_sparse_terabyte_is_not_growth_and_is_listed_but_never_stored(tmp_path):
    done, session = run_script(tmp_path, [{"sh": "truncate -s 1T sparse; echo ok > small"}, {"exit": "success"}], "-g", "world:5m")
    assert done.returncode == 0, done.stderr
    entry = RevisionLog(session).manifest()["sparse"]
    assert entry["size"] == 1 << 40 and entry["sha"] is None
    assert set(exported(session)) == {"small"}


def test_a_world_over_the_entry_cap_gets_no_revision_and_the_agent_is_told(tmp_path):
    env = {**os.environ, "QUINEBOX_WORLD_MAX_ENTRIES": "500"}
    scripts(tmp_path, mission=[{"sh": "mkdir junk; cd junk; seq 1 2000 | xargs touch"}, {"sh": "echo still here >&4"}, {"exit": "success"}])
    done = qb("run", "-q", "--json", "-m", f"script:{tmp_path / 'mission.yaml'}", "junk", env=env)
    assert (done.returncode, done.stdout) == (0, b"still here\n")
    session = json.loads(done.stderr.decode().splitlines()[-1])["session"]
    assert any(r["kind"] == "world_error" and "more than 500 entries" in r["message"] for r in read_tape(session))


def test_world_dir_is_the_callers_directory_read_and_written_in_place(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "in.txt").write_text("input\n")
    if os.getuid() == 0:  # the box's user is a host uid of its own (backends/oci/idmap.py; 1000 on the engine): the dir must let it write
        work.chmod(0o1777)
        (work / "in.txt").chmod(0o644)
    result = quinebox.exec(["sh", "-c", "cat in.txt; echo out > out.txt"], world=str(work))
    assert (result.returncode, result.stdout) == (0, b"input\n"), result.stderr
    assert (work / "out.txt").read_text() == "out\n"
    made = os.stat(work / "out.txt").st_uid
    if os.getuid() != 0:
        assert made == os.getuid()
    elif os.environ.get("QUINEBOX_BACKEND") == "docker":
        assert made == AGENT_UID
    else:
        assert made not in {entry.pw_uid for entry in pwd.getpwall()} and idmap.holding(made) is not None  # no account's uid


def test_a_world_tar_is_unpacked_safely_or_refused_whole(tmp_path):
    good, bad = io.BytesIO(), io.BytesIO()
    with tarfile.open(fileobj=good, mode="w") as tar:
        info = tarfile.TarInfo("data/x")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"hello"))
    with tarfile.open(fileobj=bad, mode="w") as tar:
        info = tarfile.TarInfo("../../etc/evil")
        tar.addfile(info, io.BytesIO(b""))
    (tmp_path / "good.tar").write_bytes(good.getvalue())
    (tmp_path / "bad.tar").write_bytes(bad.getvalue())
    ok = qb("exec", "--world-tar", str(tmp_path / "good.tar"), "--", "cat", "/world/data/x")
    assert (ok.returncode, ok.stdout) == (0, b"hello")
    refused = qb("exec", "--world-tar", str(tmp_path / "bad.tar"), "--", "true")
    assert refused.returncode == 125 and b"refused archive" in refused.stderr and refused.stderr.count(b"\n") == 1


def test_exports_keep_a_boxs_symlinks_as_links_and_never_what_they_point_at(tmp_path):
    done, session = run_script(tmp_path, [{"sh": "ln -s /etc escape; ln -s /etc/shadow shadow; mkdir d; echo x > d/x"}, {"exit": "success"}])
    assert done.returncode == 0, done.stderr
    members = exported(session)
    assert members["escape"].issym() and members["escape"].linkname == "/etc"
    assert sorted(members) == ["d", "d/x", "escape", "shadow"]


def test_world_frames_from_a_hostile_guest_earn_errors_not_harm(fake_openai):
    attack = textwrap.dedent(
        """
        import socket, struct, json
        def ask(message):
            s = socket.socket(socket.AF_UNIX); s.connect("/run/quinebox/host.sock")
            body = json.dumps(message).encode(); s.sendall(struct.pack(">II", len(body), 0) + body)
            print(s.recv(4096)[8:200])
        ask({"kind": "restore_world", "revision": "../../etc"})
        ask({"kind": "restore_world", "revision": 10**30})
        ask({"kind": "adopt", "session": "../../../etc"})
        ask({"kind": "revise", "turn": "x"})
        """
    )
    encoded = base64.b64encode(attack.encode()).decode()
    fake_openai.steps = [sh(f"echo {encoded} | base64 -d | python3"), exit_()]
    result = quinebox.run("attack the world")
    assert result.returncode == 0
    [answers] = [m["content"] for m in fake_openai.requests[1].body["messages"] if m["role"] == "tool"]
    assert answers.count('"kind":"error"') == 4
    for words in ("needs an integer revision", "no revision 1000000000000000000000000000000", "is not a child of this box", "malformed revise"):
        assert words in answers


@pytest.mark.root_only  # it counts the engine's volumes
def test_commands_that_write_nothing_leave_no_world_and_children_leave_no_volumes(engine, tmp_path):
    result = quinebox.exec(["true"])
    assert not session_dir(result.session).exists()
    done = qb("exec", *TREE, "--", "sh", "-c", "quinebox exec -- true; quinebox exec -- sh -c 'echo x > /world/y'")
    assert done.returncode == 0
    assert engine.volumes.list(filters={"label": LABEL_SESSION}) == []

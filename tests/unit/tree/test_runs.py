"""Run records of map and batch (tree/runs.py) and the view's reader of them (view/runs_view.py): no engine needed.

The reader is driven over hand-made run dirs in every state, and over torn and hostile files; the writer
through the real Runner, with `start_agent` replaced by a stand-in that needs no box.
"""

import errno
import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from quinebox.processes import owner_id, process_start_ticks
from quinebox.tree import fanout, runs
from quinebox.view import runs_view

DEAD = f"{socket.gethostname()}:{2**30}:1"  # a pid past any pid_max: never alive


@pytest.fixture(autouse=True)
def state(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("QUINEBOX_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def line(value) -> bytes:
    return (value if isinstance(value, bytes) else json.dumps(value).encode()) + b"\n"


def make_run(tmp_path: Path, run_id: str, *, names=("a", "b"), owner=None, attempts=(), results=(), end=None, resumed=(), started=1000.0) -> Path:
    """A run dir as runs.py would leave it, and its out dir; `attempts` and `results` are lines (dicts or raw bytes)."""
    out = tmp_path / f"out-{run_id}"
    out.mkdir(exist_ok=True)
    here = runs.runs_dir() / run_id
    here.mkdir(parents=True)
    inputs = [{"name": name, "source": f"/in/{name}"} for name in names]
    doc = {"id": run_id, "kind": "map", "mission": "Count", "out": str(out), "started": started, "pid": 1, "pid_start": "1",
           "owner": owner_id() if owner is None else owner, "total": len(inputs), "inputs": inputs, "resumed": list(resumed)}
    (here / runs.RUN).write_text(json.dumps(doc))
    (here / runs.ATTEMPTS).write_bytes(b"".join(line(a) for a in attempts))
    (out / fanout.RESULTS).write_bytes(b"".join(line(r) for r in results))
    if end is not None:
        (here / runs.END).write_text(json.dumps({"ended": 2000.0, "exit_code": end}))
    return out


def tried(name, session, t=1000.0):
    return {"t": t, "name": name, "source": f"/in/{name}", "session": session}


def result(name, code, *, run="r1", session="s-final", attempts=1, **more):
    return {"input": f"/in/{name}", "name": name, "exit_code": code, "duration_s": 1.5, "tokens": 42, "session": session,
            "termination": "exit" if code == 0 else "failure", "attempts": attempts, "run": run, **more}


# (attempts, results, end, owner alive, resumed) → (run state, input a's state, exit, attempts, session, termination)
CASES = {
    "queued": ([], [], None, True, [], ("running", "queued", None, 0, None, None)),
    "running": ([tried("a", "s1")], [], None, True, [], ("running", "running", None, 1, "s1", None)),
    "done": ([tried("a", "s1")], [result("a", 0, session="s1")], 0, True, [], ("done", "done", 0, 1, "s1", "exit")),
    "failed": ([tried("a", "s1")], [result("a", 1, session="s1")], 1, True, [], ("failed", "failed", 1, 1, "s1", "failure")),
    "done before the end": ([tried("a", "s1")], [result("a", 0, session="s1")], None, True, [], ("running", "done", 0, 1, "s1", "exit")),
    "killed -9 mid-attempt": ([tried("a", "s1")], [], None, False, [], ("killed", "failed", None, 1, "s1", "killed")),
    "killed before it started a": ([], [], None, False, [], ("killed", "queued", None, 0, None, None)),
    "stopped by Ctrl-C": ([tried("a", "s1")], [], 130, True, [], ("failed", "failed", None, 1, "s1", "stopped")),
    "retried, still running": ([tried("a", "s1"), tried("a", "s2")], [], None, True, [], ("running", "running", None, 2, "s2", None)),
    "retried, then done": ([tried("a", "s1"), tried("a", "s2")], [result("a", 0, session="s2", attempts=2)], 0, True, [],
                           ("done", "done", 0, 2, "s2", "exit")),
    "cluster attempt: session known at the end": ([tried("a", None)], [result("a", 0, session="s9")], 0, True, [], ("done", "done", 0, 1, "s9", "exit")),
    "resumed: an earlier run's success": ([], [result("a", 0, run="r0", session="old")], 0, True, ["/in/a"], ("done", "done", 0, 1, "old", "exit")),
    "resumed list, but that line failed": ([], [result("a", 1, run="r0")], 0, True, ["/in/a"], ("done", "queued", None, 0, None, None)),
    "another run's line, not resumed": ([], [result("a", 0, run="r7")], None, True, [], ("running", "queued", None, 0, None, None)),
    "this run's line wins over a resumed one": ([tried("a", "s3")], [result("a", 0, run="r0", session="old"), result("a", 0, session="s3")], 0, True,
                                                ["/in/a"], ("done", "done", 0, 1, "s3", "exit")),
    "a run without an owner cannot be alive": ([tried("a", "s1")], [], None, None, [], ("killed", "failed", None, 1, "s1", "killed")),
}


@pytest.mark.parametrize("case", CASES)
def test_each_input_and_the_run_in_each_state(tmp_path, case):
    attempts, results_, end, alive, resumed, expected = CASES[case]
    owner = 0 if alive is None else owner_id() if alive else DEAD  # 0: not an owner at all
    make_run(tmp_path, "r1", attempts=attempts, results=results_, end=end, resumed=resumed, owner=owner)
    got = runs_view.run("r1")
    a, b = got["inputs"]
    assert (got["state"], a["state"], a["exit_code"], a["attempts"], a["session"], a["termination"]) == expected
    assert b == {"name": "b", "source": "/in/b", "state": "queued", "exit_code": None, "attempts": 0, "session": None, "duration_s": None,
                 "tokens": None, "termination": None, "output": None, "output_bytes": None}
    [summary] = runs_view.runs()
    assert summary == {key: value for key, value in got.items() if key != "inputs"}
    assert summary["total"] == 2
    assert (summary["done"], summary["failed"], summary["running"]) == tuple(sum(r["state"] == s for r in got["inputs"]) for s in ("done", "failed", "running"))
    assert summary["exit_code"] == end and (summary["ended"] == 2000.0) == (end is not None)


def test_a_running_input_counts_its_time_from_its_first_attempt(tmp_path):
    make_run(tmp_path, "r1", attempts=[tried("a", "s1", t=time.time() - 5), tried("a", "s2", t=time.time() - 1)])
    a = runs_view.run("r1")["inputs"][0]
    assert a["state"] == "running" and 5 <= a["duration_s"] < 60


def test_a_finished_input_has_its_result_and_the_head_of_its_deliverable(tmp_path):
    out = make_run(tmp_path, "r1", names=("a", "b", "c", "d"), attempts=[tried(n, f"s-{n}") for n in "abcd"],
                   results=[result(n, 0, session=f"s-{n}") for n in "abcd"], end=0)
    (out / "a.out").write_text("The material has 3 lines.\n")
    (out / "b.out").write_bytes(b"x" * 10000)
    (out / "c.out").write_bytes(b"\xff\xfebinary\x00")
    os.symlink("/etc/passwd", out / "d.out")
    rows = {row["name"]: row for row in runs_view.run("r1")["inputs"]}
    assert rows["a"] == {"name": "a", "source": "/in/a", "state": "done", "exit_code": 0, "attempts": 1, "session": "s-a", "duration_s": 1.5,
                              "tokens": 42, "termination": "exit", "output": "The material has 3 lines.\n", "output_bytes": 26}
    assert (len(rows["b"]["output"]), rows["b"]["output_bytes"]) == (runs_view.OUTPUT_HEAD, 10000)
    assert rows["c"]["output"] == "\ufffd\ufffdbinary\x00"
    assert (rows["d"]["output"], rows["d"]["output_bytes"]) == (None, None)  # a link out of DIR is not followed
    assert runs_view.runs()[0] == {"id": "r1", "kind": "map", "mission": "Count", "out": str(out), "started": 1000.0, "ended": 2000.0,
                                       "exit_code": 0, "state": "done", "total": 4, "done": 4, "failed": 0, "running": 0}


TORN_ATTEMPTS = [
    tried("a", "s1"), b"not json", b"[1, 2]", {"name": 5, "session": "x"}, {"name": "a", "t": "soon", "session": 7}, b"",
    b'{"t": 1, "name": "b", "sess',  # torn: the last piece, without its newline
]
TORN_RESULTS = [
    b"{junk", b"null", {**result("a", 0), "exit_code": "0"}, {**result("a", 0), "exit_code": True}, {**result("a", 0), "input": 5},
    {**result("b", 1), "tokens": "many", "duration_s": [], "attempts": 2.5, "session": {"x": 1}, "termination": 3},
]


def test_torn_and_hostile_lines_are_skipped_never_raised(tmp_path):
    out = make_run(tmp_path, "r1", attempts=TORN_ATTEMPTS, results=TORN_RESULTS)
    with open(out / fanout.RESULTS, "ab") as torn:
        torn.write(json.dumps(result("a", 0)).encode()[:-3])  # the last line cut short by a kill
    a, b = runs_view.run("r1")["inputs"]
    assert (a["state"], a["attempts"], a["session"]) == ("running", 2, None)  # two lines named "a"; the second's session was not a string
    assert a["duration_s"] is not None
    assert b == {"name": "b", "source": "/in/b", "state": "failed", "exit_code": 1, "attempts": 0, "session": None, "duration_s": None,
                 "tokens": None, "termination": None, "output": None, "output_bytes": None}


@pytest.mark.parametrize(
    "run_json",
    [b"", b"{", b"[]", b"null", b'"text"', json.dumps({"inputs": "all"}).encode(), json.dumps({"inputs": [1, {"name": "a"}, {"name": "b", "source": 2}]}).encode()],
)
def test_a_junk_run_json_is_no_run_or_a_run_of_no_inputs(run_json):
    here = runs.runs_dir() / "r1"
    here.mkdir(parents=True)
    (here / runs.RUN).write_bytes(run_json)
    (here / runs.END).write_bytes(b"{junk")
    listed = runs_view.runs()
    if listed:
        [row] = listed
        assert (row["total"], row["out"], row["kind"], row["state"]) == (0, None, None, "killed")
        assert runs_view.run("r1")["inputs"] == []
    else:
        with pytest.raises(KeyError):
            runs_view.run("r1")


def test_hostile_fields_of_run_json_are_dropped(tmp_path):
    make_run(tmp_path, "r1", names=("a", "a", "../../etc/passwd"), attempts=[tried("../../etc/passwd", "s")], results=[])
    path = runs.runs_dir() / "r1" / runs.RUN
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "kind": ["map"], "mission": 3, "started": "yesterday", "resumed": "all"}))
    got = runs_view.run("r1")
    assert (got["kind"], got["mission"], got["started"], got["total"]) == (None, None, None, 2)  # "a" once
    assert got["inputs"][1]["output"] is None and got["inputs"][1]["state"] == "running"
    path.write_text(json.dumps({**doc, "out": "relative/out"}))
    assert runs_view.run("r1")["out"] is None


def test_files_that_are_not_regular_never_block_the_reader(tmp_path):
    out = make_run(tmp_path, "r1", attempts=[tried("a", "s1")])
    os.unlink(out / fanout.RESULTS)
    os.mkfifo(out / fanout.RESULTS)
    os.mkfifo(out / "a.out")
    os.unlink(runs.runs_dir() / "r1" / runs.ATTEMPTS)
    os.mkfifo(runs.runs_dir() / "r1" / runs.ATTEMPTS)
    got = runs_view.run("r1")
    assert [row["state"] for row in got["inputs"]] == ["queued", "queued"] and got["inputs"][0]["output"] is None


@pytest.mark.parametrize("run_id", ["nope", "../r1", "r1/", ".", "..", "", "r 1", None, 7])
def test_an_unknown_or_malformed_run_id_is_a_key_error(tmp_path, run_id):
    make_run(tmp_path, "r1")
    with pytest.raises(KeyError):
        runs_view.run(run_id)


def test_runs_lists_newest_first_and_ignores_what_is_not_a_run(tmp_path):
    make_run(tmp_path, "20240101-000000000-aaaaaa", started=100.0)
    make_run(tmp_path, "20250101-000000000-bbbbbb", started=300.0)
    make_run(tmp_path, "20240601-000000000-cccccc", started=200.0)
    (runs.runs_dir() / ".tmp-something").mkdir()
    (runs.runs_dir() / "no-run-json").mkdir()
    (runs.runs_dir() / "stray-file").write_text("x")
    assert [row["id"] for row in runs_view.runs()] == ["20250101-000000000-bbbbbb", "20240601-000000000-cccccc", "20240101-000000000-aaaaaa"]


def test_no_runs_dir_is_no_runs():
    assert runs_view.runs() == [] and isinstance(runs_view.run_stamp(), str)


def test_the_stamp_changes_with_every_change_and_only_then(tmp_path):
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        owner = f"{socket.gethostname()}:{sleeper.pid}:{process_start_ticks(sleeper.pid)}"
        out = make_run(tmp_path, "r1", owner=owner)
        seen = [runs_view.run_stamp()]
        assert runs_view.run_stamp() == seen[-1]
        assert runs_view.run("r1")["state"] == "running"

        def changed() -> bool:
            seen.append(runs_view.run_stamp())
            return seen[-1] not in seen[:-1]

        with open(runs.runs_dir() / "r1" / runs.ATTEMPTS, "ab") as attempts:
            attempts.write(line(tried("a", "s1")))
        assert changed()
        with open(out / fanout.RESULTS, "ab") as results_:
            results_.write(line(result("a", 0)))
        assert changed()
        sleeper.send_signal(signal.SIGKILL)
        sleeper.wait()
        assert changed()  # nothing on disk changed: its owner died
        assert runs_view.run("r1")["state"] == "killed"
        make_run(tmp_path, "r2")
        assert changed()
        (runs.runs_dir() / "r2" / runs.END).write_text(json.dumps({"ended": 1.0, "exit_code": 0}))
        assert changed()
        assert runs_view.run_stamp() == seen[-1]
    finally:
        sleeper.kill()
        sleeper.wait()


# The writer


def test_ids_sort_by_start_and_never_collide():
    times = [1.0, 1.002, 1.5, 60.0, 3600.5, 1.7e9]
    ids = [runs.new_id(t) for t in times]
    assert ids == sorted(ids)
    assert len({runs.new_id(5.0) for _ in range(1000)}) == 1000
    assert all(runs_view.RUN_ID.fullmatch(i) for i in ids)


def test_a_record_written_by_the_writer_reads_back_through_each_state(tmp_path):
    record = runs.RunRecord("batch", None, tmp_path / "out")
    jobs = [SimpleNamespace(name=n, source=f"/in/{n}") for n in "ab"]
    record.begin(jobs, resumed={"/in/b"})
    doc = json.loads((record.dir / runs.RUN).read_text())
    assert doc["owner"] == owner_id() and doc["pid"] == os.getpid() and doc["resumed"] == ["/in/b"]
    assert doc["out"] == str((tmp_path / "out").resolve()) and doc["total"] == 2 and doc["kind"] == "batch" and doc["mission"] is None
    assert runs_view.run(record.id)["state"] == "running"
    record.attempt("a", "/in/a", "s1")
    assert [row["state"] for row in runs_view.run(record.id)["inputs"]] == ["running", "queued"]
    record.end(0)
    got = runs_view.run(record.id)
    assert (got["state"], got["exit_code"]) == ("done", 0) and abs(got["ended"] - time.time()) < 60
    assert sorted(os.listdir(record.dir)) == [runs.ATTEMPTS, runs.END, runs.RUN]  # no temporary file left


def test_attempts_from_many_threads_are_whole_lines(tmp_path):
    record = runs.RunRecord("map", "m", tmp_path)
    record.begin([], ())
    threads = [threading.Thread(target=lambda i=i: [record.attempt(f"n{i}", "s" * 3000, f"session-{i}-{k}") for k in range(20)]) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    lines = (record.dir / runs.ATTEMPTS).read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) == 161 and all(json.loads(raw)["source"] == "s" * 3000 for raw in lines[:-1])


def test_a_state_dir_that_cannot_be_written_costs_the_record_never_the_caller(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("not a dir")
    monkeypatch.setenv("QUINEBOX_STATE_DIR", str(tmp_path / "file" / "state"))
    record = runs.RunRecord("map", "m", tmp_path)
    record.begin([SimpleNamespace(name="a", source="a")], ())
    record.attempt("a", "a", "s")
    record.end(0)
    assert runs_view.runs() == []


def test_a_full_disk_costs_the_record_never_the_caller(tmp_path, monkeypatch):
    record = runs.RunRecord("map", "m", tmp_path)

    def full(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    monkeypatch.setattr(Path, "write_text", full)
    record.begin([SimpleNamespace(name="a", source="a")], ())
    record.attempt("a", "a", "s")
    record.end(0)
    monkeypatch.undo()
    assert sorted(os.listdir(record.dir)) == [runs.ATTEMPTS]  # empty: the line was skipped; no torn temporary json
    with pytest.raises(KeyError):
        runs_view.run(record.id)


# The writer as the Runner drives it


class FakeAgent:
    """What `start_agent` returns, as far as the Runner looks: it writes its deliverable at once."""

    count = 0

    def __init__(self, mission, _box=None, *, stdin, stdout, stderr, **_options):
        FakeAgent.count += 1
        self.session = SimpleNamespace(session=f"fake-{FakeAgent.count}")
        material = stdin if isinstance(stdin, bytes) else stdin.read() if hasattr(stdin, "read") else b""
        self.code = 1 if b"BAD" in material else 0
        stdout.write(b"seen: " + material)
        self.outcome = {"tokens": 7, "termination": "exit" if self.code == 0 else "failure"}
        self.proc = SimpleNamespace(engine_lost=False)

    def wait(self) -> int:
        return self.code

    def kill(self) -> None:
        pass


@pytest.fixture
def fake_agents(monkeypatch):
    from quinebox.tree import supervisor

    monkeypatch.setattr(supervisor, "start_agent", FakeAgent)


def run_map(tmp_path, names, **options) -> fanout.Runner:
    for name in names:
        if not (tmp_path / name).exists():
            (tmp_path / name).write_text(name.upper())
    jobs = fanout.map_jobs("Shout", [str(tmp_path / n) for n in names], None)
    runner = fanout.Runner(jobs, str(tmp_path / "out"), fanout.Options(parallel=2, **options), lambda *_: None)
    runner.run()
    return runner


def test_a_map_is_recorded_from_its_start_to_its_end(tmp_path, fake_agents):
    (tmp_path / "c").write_text("BAD")
    runner = run_map(tmp_path, ["a", "b", "c"])
    got = runs_view.run(runner.record.id)
    assert {k: got[k] for k in ("kind", "mission", "state", "exit_code", "total", "done", "failed", "running")} == {
        "kind": "map", "mission": "Shout", "state": "failed", "exit_code": 1, "total": 3, "done": 2, "failed": 1, "running": 0}
    rows = {row["name"]: row for row in got["inputs"]}
    assert {n: (r["state"], r["exit_code"], r["attempts"], r["tokens"], r["output"]) for n, r in rows.items()} == {
        "a": ("done", 0, 1, 7, "seen: A"), "b": ("done", 0, 1, 7, "seen: B"), "c": ("failed", 1, 1, 7, "seen: BAD")}
    attempts = [json.loads(raw) for raw in (runner.record.dir / runs.ATTEMPTS).read_text().splitlines()]
    assert sorted(a["session"] for a in attempts) == sorted(r["session"] for r in rows.values())
    assert all(json.loads(raw)["run"] == runner.record.id for raw in (tmp_path / "out" / fanout.RESULTS).read_text().splitlines())


def test_a_resumed_map_shows_what_an_earlier_run_finished(tmp_path, fake_agents):
    (tmp_path / "c").write_text("BAD")
    first = run_map(tmp_path, ["a", "b", "c"])
    (tmp_path / "c").write_text("fixed")
    second = run_map(tmp_path, ["a", "b", "c"], resume=True)
    before, after = (runs_view.run(r.record.id) for r in (first, second))
    assert (after["state"], after["done"], after["failed"]) == ("done", 3, 0)
    assert [r["session"] for r in after["inputs"][:2]] == [r["session"] for r in before["inputs"][:2]]  # kept from the first run
    assert after["inputs"][2]["session"] != before["inputs"][2]["session"] and after["inputs"][2]["output"] == "seen: fixed"
    assert [r["id"] for r in runs_view.runs()] == [second.record.id, first.record.id]


def test_each_try_gets_one_box_options_its_jobs_box_and_the_runs_rules(tmp_path, monkeypatch):
    from quinebox.box.options import BoxOptions
    from quinebox.tree import supervisor

    boxes = []
    monkeypatch.setattr(supervisor, "start_agent", lambda mission, box, **kw: boxes.append(box) or FakeAgent(mission, **kw))
    (tmp_path / "a").write_text("a")
    jobs = fanout.map_jobs("Shout", [str(tmp_path / "a")], None, BoxOptions(grants=("mem:64m",), image="alpine", timeout="5m"), model="m")
    run = fanout.Options(ask=("net:example.com",), deny=("net:evil.example",), ask_timeout="0")
    assert fanout.Runner(jobs, str(tmp_path / "out"), run, lambda *_: None).run() == 0
    assert (jobs[0].model, boxes) == ("m", [BoxOptions(
        grants=("mem:64m",), image="alpine", timeout="5m", ask=("net:example.com",), deny=("net:evil.example",), ask_timeout="0")])


def test_a_batch_is_recorded_as_a_batch_without_one_mission(tmp_path, fake_agents):
    (tmp_path / "jobs.yaml").write_text(json.dumps({"jobs": [{"name": "x", "mission": "m1", "input": "1"}, {"name": "y", "mission": "m2", "input": "2"}]}))
    runner = fanout.Runner(fanout.batch_jobs(str(tmp_path / "jobs.yaml")), str(tmp_path / "out"), fanout.Options(), lambda *_: None)
    assert runner.run() == 0
    got = runs_view.run(runner.record.id)
    assert (got["kind"], got["mission"], got["state"], [r["output"] for r in got["inputs"]]) == ("batch", None, "done", ["seen: 1", "seen: 2"])


def test_a_map_whose_state_dir_is_unwritable_still_runs(tmp_path, monkeypatch, fake_agents):
    (tmp_path / "file").write_text("not a dir")
    monkeypatch.setenv("QUINEBOX_STATE_DIR", str(tmp_path / "file" / "state"))
    runner = run_map(tmp_path, ["a", "b"])
    assert runner.tally.done == 2 and runner.tally.failed == 0
    assert (tmp_path / "out" / "a.out").read_text() == "seen: A"

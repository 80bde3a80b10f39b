"""Whatever lines a tape holds (forged records of every kind among them), the view answers, whole: the typed reader
(agent/records.py) passes over what does not fit, and the view shows only what does."""

from __future__ import annotations

import json

import pytest

from quinebox.agent.store import Index, Tape, read_records, read_tape
from quinebox.state import session_dir
from quinebox.view.catalog import Catalog
from quinebox.view.export import export

FORGED = [
    {"kind": "response", "turn": 1, "message": {"tool_calls": 5}},
    {"kind": "response", "turn": 2, "message": "x", "usage": "lots"},
    {"kind": "request", "turn": "one", "messages": "not a list"},
    {"kind": "tool", "name": ["sh"], "args": 7, "exit_code": "0", "result": {"deep": [1, 2]}},
    {"kind": "spawn", "child": {"id": 1}, "what": None},
    {"kind": "revision", "rev": "latest", "files": None},
    {"kind": "outcome", "exit_code": "done", "termination": 3},
]


@pytest.fixture
def catalog(tmp_path, monkeypatch):
    monkeypatch.setenv("QUINEBOX_STATE_DIR", str(tmp_path / "state"))
    index = Index()
    index.start("aaaaaaaaaaaa", parent=None, mission="root", model="script:x")
    index.start("bbbbbbbbbbbb", parent="aaaaaaaaaaaa", mission="child", model="script:x")
    index.close()
    for session in ("aaaaaaaaaaaa", "bbbbbbbbbbbb"):
        tape = Tape(session)
        tape.append("meta", session=session, mission="m", model="script:x", grants="all of them", image=3)
        tape.append("meta", session=session, mission="m", model="script:x", image="debian")
        for record in FORGED:
            tape.append(record["kind"], **{k: v for k, v in record.items() if k != "kind"})
        tape.append("tool", t=1e308, i=-1, turn=1, name="sh", args={}, exit_code=0, result="")  # the host's time wins
        tape.close()
        with open(session_dir(session) / "tape.jsonl", "ab") as f:
            f.write(b"not json at all\n[1, 2]\n")  # a line no writer of ours makes: skipped by the view
    opened = Catalog()
    yield opened
    opened.close()


def test_the_host_keeps_its_own_time_on_every_record(catalog):
    records = read_records("aaaaaaaaaaaa")
    assert [r["kind"] for r in read_tape("aaaaaaaaaaaa")] == ["meta", "tool"] and records.skipped == len(FORGED) + 3
    assert all(isinstance(r.t, float) and r.t < 1e10 for r in records)


def test_forged_records_leave_every_answer_whole(catalog, tmp_path):
    tree = catalog.sessions.tree("aaaaaaaaaaaa")
    assert [(n["id"], n["parent"]) for n in tree["nodes"]] == [("aaaaaaaaaaaa", None), ("bbbbbbbbbbbb", "aaaaaaaaaaaa")]
    assert tree["nodes"][0]["grants"] == []  # not a list: not grants
    transcript = catalog.sessions.transcript("bbbbbbbbbbbb")
    assert [(e["i"], e["kind"]) for e in transcript["entries"]] == [(0, "meta"), (1, "tool")]  # numbered by the view, never by the box
    assert transcript["entries"][-1]["t"] < 1e10 and transcript["next"] == 2
    assert catalog.sessions.one("aaaaaaaaaaaa")["meta"]["image"] == "debian"
    json.loads(catalog.redactor.json(catalog.sessions.list()))
    counts = export(str(tmp_path / "bundle"), catalog=catalog)
    assert counts["sessions"] == 2 and (tmp_path / "bundle" / "data.js").stat().st_size > 0


def test_a_topic_names_no_path(catalog):
    found = catalog.stamps(["session:../../etc", "session:aaaaaaaaaaaa", "tree:aaaaaaaaaaaa", "nonsense"])
    assert found["session:../../etc"][0] is None and isinstance(found["session:aaaaaaaaaaaa"][0], int)
    assert "nonsense" not in found


def test_a_secret_across_the_pages_cut_is_not_left_half_shown(tmp_path, monkeypatch):
    from quinebox.view.sessions_view import MAX_TEXT

    monkeypatch.setenv("QUINEBOX_STATE_DIR", str(tmp_path / "state"))
    key = "sk-live-" + "0123456789abcdef" * 2
    monkeypatch.setenv("OPENAI_API_KEY", key)
    index = Index()
    index.start("cccccccccccc", parent=None, mission="echo", model="script:x")
    index.close()
    tape = Tape("cccccccccccc")
    tape.append("tool", turn=1, name="sh", args={}, exit_code=0, result="x" * (MAX_TEXT - 10) + key + " and more")
    tape.close()
    catalog = Catalog()
    try:
        text = catalog.redactor.json(catalog.sessions.transcript("cccccccccccc"))
    finally:
        catalog.close()
    assert key[:10] not in text and "[redacted]"[:10] in text

"""The audit log sealed into segments as it grows: one chain through all of them, read and verified in order,
any edit or removal of a segment found at its first record, and many writers sealing at once losing nothing."""

import os
import stat
import subprocess
import sys

import pytest
from test_audit_log import WRITER

from quinebox.audit.log import AuditLog, verify


@pytest.fixture
def small(monkeypatch):
    monkeypatch.setenv("QUINEBOX_AUDIT_SEGMENT", "2000")
    return 2000


def filled(tmp_path, count):
    log = AuditLog(tmp_path / "audit")
    for index in range(count):
        log.append("box_created", f"s{index}", grants=["mem:1g"], index=index)
    return log


def ranges(log):
    return [tuple(int(n) for n in p.stem.split("-")) for p in sorted(log.segments.iterdir())]


def test_a_log_past_its_segment_size_is_sealed_and_the_chain_runs_on_through_the_segments(tmp_path, small):
    log = filled(tmp_path, 40)
    spans = ranges(log)
    assert len(spans) >= 3 and spans[0][0] == 0
    assert all(later[0] == earlier[1] + 1 for earlier, later in zip(spans, spans[1:], strict=False))  # contiguous
    for path in log.segments.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o400 and path.stat().st_size >= small
    assert log.path.stat().st_size < small
    records = list(log.records())
    assert [r["seq"] for r in records] == list(range(40))
    assert [r["prev"] for r in records[1:]] == [r["hash"] for r in records[:-1]]  # across every seal too
    assert verify(log).line() == "intact: 40 record(s)"


def test_an_empty_log_after_a_seal_goes_on_from_the_segments_last_record(tmp_path, monkeypatch):
    monkeypatch.setenv("QUINEBOX_AUDIT_SEGMENT", "1")  # every record seals its log
    log = filled(tmp_path, 3)
    assert ranges(log) == [(0, 0), (1, 1), (2, 2)] and log.path.read_bytes() == b""
    assert verify(log).line() == "intact: 3 record(s)"


def test_a_torn_first_record_after_a_seal_is_repaired_on_from_the_segments_last_record(tmp_path, monkeypatch):
    """A writer killed mid-record right after a seal leaves a log of one torn line: the repair goes on from the
    segment's last record, as any first record after a seal does (it started the chain again at 0: tampering)."""
    monkeypatch.setenv("QUINEBOX_AUDIT_SEGMENT", "1")
    log = filled(tmp_path, 3)
    log.path.write_bytes(b'{"seq":3,"time":"2026-12-07T')  # the next writer's record, cut short by SIGKILL
    monkeypatch.setenv("QUINEBOX_AUDIT_SEGMENT", str(64 << 20))
    log.append("box_ended", "s9", exit=0)
    records = list(log.records())
    assert [(r["seq"], r["kind"]) for r in records[3:]] == [(3, "audit_repaired"), (4, "box_ended")]
    assert records[3]["prev"] == records[2]["hash"]
    assert verify(log).line() == "intact: 5 record(s)"


def edit_one_byte(path):
    os.chmod(path, 0o600)
    data = bytearray(path.read_bytes())
    data[data.index(b'"index":') + 8] ^= 1
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "which, tamper, words",
    [
        (1, edit_one_byte, "its contents do not match its hash: it was edited"),
        (1, os.unlink, "out of place: it says it is record"),
        (0, os.unlink, "out of place: it says it is record"),
    ],
)
def test_an_edited_or_removed_segment_is_found_at_its_first_record(tmp_path, small, which, tamper, words):
    log = filled(tmp_path, 40)
    segment = sorted(log.segments.iterdir())[which]
    first = int(segment.stem.split("-")[0])
    tamper(segment)
    verdict = verify(log)
    assert (verdict.bad, words in verdict.why) == (first, True), verdict.line()


def test_eight_processes_appending_across_many_seals_make_one_chain_with_every_record(tmp_path):
    where = str(tmp_path / "audit")
    env = {**os.environ, "QUINEBOX_AUDIT_SEGMENT": "20000"}
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, where, f"w{n}", "150"], env=env) for n in range(8)]
    assert [w.wait(120) for w in writers] == [0] * 8
    log = AuditLog(tmp_path / "audit")
    assert len(ranges(log)) > 10
    assert verify(log).line() == "intact: 1200 record(s)"
    seen = sorted((r["session"], r["facts"]["index"]) for r in log.records())
    assert seen == sorted((f"w{n}", i) for n in range(8) for i in range(150))

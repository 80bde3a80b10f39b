"""The audit log: a chain that any edit breaks at the right record, many writers at once, and torn tails told from tampering."""

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest
from commands import QUINEBOX

from quinebox.audit.log import MAX_TEXT, AuditLog, audit_key, verify

KEY = b"k" * 32


def filled(tmp_path, count=6, key=None):
    log = AuditLog(tmp_path / "audit", key)
    for index in range(count):
        log.append("box_created", f"s{index}", grants=["mem:1g"], index=index)
    return log


def lines(log):
    return log.path.read_bytes().splitlines(keepends=True)


def rewrite(log, new_lines):
    log.path.write_bytes(b"".join(new_lines))


def test_records_chain_and_checkpoint_their_head(tmp_path):
    log = filled(tmp_path, 3)
    records = list(log.records())
    assert [r["seq"] for r in records] == [0, 1, 2]
    assert records[0]["prev"] == "0" * 64
    assert [r["prev"] for r in records[1:]] == [r["hash"] for r in records[:-1]]
    assert (records[1]["session"], records[1]["kind"], records[1]["facts"]) == ("s1", "box_created", {"grants": ["mem:1g"], "index": 1})
    head = json.loads(log.head_path.read_text())
    assert head == {"seq": 2, "hash": records[2]["hash"]}
    assert verify(log).line() == "intact: 3 record(s)"


def edit_one_byte(log):
    data = lines(log)
    data[2] = data[2].replace(b'"index":2', b'"index":3')
    rewrite(log, data)


def delete_one(log):
    data = lines(log)
    del data[3]
    rewrite(log, data)


def swap_two(log):
    data = lines(log)
    data[1], data[2] = data[2], data[1]
    rewrite(log, data)


def insert_one(log):
    data = lines(log)
    forged = json.loads(data[2])
    forged["facts"] = {"forged": True}
    rewrite(log, data[:3] + [json.dumps(forged).encode() + b"\n"] + data[3:])


def truncate_tail(log):
    rewrite(log, lines(log)[:4])


def unparsable(log):
    data = lines(log)
    data[1] = b"{not json\n"
    rewrite(log, data)


@pytest.mark.parametrize(
    "tamper, bad, words",
    [
        (edit_one_byte, 2, "do not match its hash: it was edited"),
        (delete_one, 3, "out of place: it says it is record 4"),
        (swap_two, 1, "out of place: it says it is record 2"),
        (insert_one, 3, "out of place: it says it is record 2"),
        (truncate_tail, 4, "the tail was cut off"),
        (unparsable, 1, "does not parse"),
    ],
)
def test_every_kind_of_tampering_names_the_first_bad_record(tmp_path, tamper, bad, words):
    log = filled(tmp_path)
    tamper(log)
    verdict = verify(log)
    assert (verdict.intact, verdict.bad) == (False, bad), verdict.line()
    assert words in verdict.line()


def recompute_after_edit(log, key=None):
    """What someone who can write the state dir can do: edit a record, then rehash the chain and the head."""
    from quinebox.audit.log import _digest, canonical

    records = [json.loads(line) for line in lines(log)]
    records[2]["facts"]["index"] = 99
    previous = "0" * 64
    out = []
    for record in records:
        body = {k: v for k, v in record.items() if k not in ("hash", "mac")}
        body["prev"] = previous
        record = {**body, "hash": _digest(body), **({"mac": record["mac"]} if "mac" in record else {})}
        previous = record["hash"]
        out.append(canonical(record) + b"\n")
    rewrite(log, out)
    head = json.loads(log.head_path.read_text())
    head["hash"] = previous
    log.head_path.write_text(json.dumps(head))


def test_a_rewritten_chain_is_caught_by_the_hmac_at_the_first_record_it_changed(tmp_path):
    log = filled(tmp_path, key=KEY)
    assert verify(log).intact
    recompute_after_edit(log)
    verdict = verify(log)
    assert (verdict.bad, verdict.why) == (2, "its HMAC does not match: it was rewritten without the key")


def test_without_the_key_the_head_still_catches_a_rehashed_chain_left_with_its_old_head(tmp_path):
    log = filled(tmp_path)
    head = log.head_path.read_bytes()
    recompute_after_edit(log)
    log.head_path.write_bytes(head)
    verdict = verify(log)
    assert verdict.bad == 5 and "differs from the checkpointed head" in verdict.why


def test_a_rewritten_head_without_the_key_is_caught(tmp_path):
    log = filled(tmp_path, key=KEY)
    head = json.loads(log.head_path.read_text())
    head["mac"] = "0" * 64
    log.head_path.write_text(json.dumps(head))
    assert "head's HMAC does not match" in verify(log).why


def test_a_torn_last_line_is_torn_not_tampering_and_the_next_writer_repairs_it(tmp_path):
    log = filled(tmp_path, 3)
    whole = log.path.read_bytes()
    log.path.write_bytes(whole + b'{"seq":3,"time":"2026-11-30T')  # a writer stopped mid-record, before it moved the head
    verdict = verify(log)
    assert (verdict.intact, verdict.torn, verdict.records) == (True, True, 3)
    assert "torn" in verdict.line() and "the next write repairs it" in verdict.line()
    log.append("box_ended", "s9", exit=0)
    records = list(log.records())
    assert [r["kind"] for r in records[3:]] == ["audit_repaired", "box_ended"]
    assert records[3]["facts"]["torn_bytes"] == len(b'{"seq":3,"time":"2026-11-30T')
    assert verify(log).line() == "intact: 5 record(s)"


def test_a_torn_record_the_head_already_counted_is_a_cut(tmp_path):
    log = filled(tmp_path, 3)
    data = log.path.read_bytes()
    log.path.write_bytes(data[:-20])  # the last, checkpointed record cut short
    verdict = verify(log)
    assert (verdict.intact, verdict.bad) == (False, 2)


def test_a_box_cannot_flood_the_log(tmp_path):
    log = AuditLog(tmp_path / "audit")
    record = log.append("child_refused", "s", request={"argv": ["x" * (MAX_TEXT * 10)]})
    assert len(record["facts"]["request"]["argv"][0]) < MAX_TEXT + 40
    assert verify(log).intact


def test_fact_names_may_be_kind_and_session(tmp_path):
    log = AuditLog(tmp_path / "audit")
    record = log.append("approval_asked", "s1", kind="egress", session="other")
    assert (record["kind"], record["session"], record["facts"]) == ("approval_asked", "s1", {"kind": "egress", "session": "other"})


WRITER = """
import sys
import threading
from pathlib import Path
from quinebox.audit.log import AuditLog
log = AuditLog(Path(sys.argv[1]))
blob = ["x" * 4000] * int(sys.argv[4]) if len(sys.argv) > 4 else []
for index in range(int(sys.argv[3])):
    log.append("egress", sys.argv[2], index=index, **({"blob": blob} if blob else {}))
"""


def test_eight_processes_appending_at_once_make_one_chain_with_every_record(tmp_path):
    where = str(tmp_path / "audit")
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, where, f"w{n}", "150"]) for n in range(8)]
    assert [w.wait(120) for w in writers] == [0] * 8
    log = AuditLog(tmp_path / "audit")
    assert verify(log).line() == "intact: 1200 record(s)"
    seen = sorted((r["session"], r["facts"]["index"]) for r in log.records())
    assert seen == sorted((f"w{n}", i) for n in range(8) for i in range(150))


def test_writers_killed_at_random_moments_never_look_like_tampering(tmp_path):
    """Records of 1.6 MB take many pages to write, and the kernel stops a write between pages for SIGKILL: some rounds
    leave a real torn tail (about one in twenty here). Every round must verify, torn or not, and a write repairs it."""
    seed = random.randrange(1 << 30)
    chance = random.Random(seed)
    where = str(tmp_path / "audit")
    torn = 0
    for round_ in range(8):
        writers = [subprocess.Popen([sys.executable, "-c", WRITER, where, f"r{round_}w{n}", "100000", "400"]) for n in range(2)]
        time.sleep(0.3 + chance.random() * 0.4)
        for writer in writers:
            writer.send_signal(signal.SIGKILL)
            writer.wait()
        verdict = verify(AuditLog(tmp_path / "audit"))
        assert verdict.intact, f"seed {seed}: {verdict.line()}"
        torn += verdict.torn
    print(f"seed {seed}: {torn} of 8 rounds left a torn tail")
    log = AuditLog(tmp_path / "audit")
    log.append("box_ended", "after", exit=0)
    verdict = verify(log)
    assert verdict.intact and not verdict.torn
    assert verdict.records > 8


def test_the_key_must_live_outside_the_state_dir(tmp_path, monkeypatch):
    from quinebox.errors import ErrorKind, QuineboxError
    from quinebox.state import state_dir

    inside = state_dir() / "audit.key"
    inside.parent.mkdir(parents=True, exist_ok=True)
    inside.write_bytes(KEY)
    monkeypatch.setenv("QUINEBOX_AUDIT_KEY_FILE", str(inside))
    with pytest.raises(QuineboxError) as refused:
        audit_key()
    assert (refused.value.kind, dict(refused.value.fields)) == (ErrorKind.REFUSED, {"path": str(inside)})
    outside = tmp_path / "audit.key"
    outside.write_bytes(b"short")
    monkeypatch.setenv("QUINEBOX_AUDIT_KEY_FILE", str(outside))
    with pytest.raises(QuineboxError) as short:
        audit_key()
    assert (short.value.kind, dict(short.value.fields)) == (ErrorKind.BAD_INPUT, {"path": str(outside)})
    outside.write_bytes(KEY + b"\n")
    assert audit_key() == KEY
    inside.unlink()


def quinebox(*args, env):
    return subprocess.run([QUINEBOX, *args], capture_output=True, text=True, env=env, timeout=60)


def test_the_audit_commands(tmp_path):
    env = {**os.environ, "QUINEBOX_STATE_DIR": str(tmp_path / "state")}
    log = AuditLog(tmp_path / "state" / "audit")
    log.append("box_created", "aaa111", grants=["mem:1g"])
    log.append("egress", "bbb222", host="evil\x1b[2J\nAllow? [y]", allowed=False)
    shown = quinebox("audit", env=env)
    assert shown.returncode == 0
    assert len(shown.stdout.splitlines()) == 2
    assert "\x1b" not in shown.stdout and "evil\\x1b[2J\\x0aAllow? [y]" in shown.stdout
    only = quinebox("audit", "--session", "bbb", "--json", env=env)
    assert [json.loads(line)["session"] for line in only.stdout.splitlines()] == ["bbb222"]
    assert quinebox("audit", "--since", "1h", env=env).stdout.count("\n") == 2
    assert quinebox("audit", "--since", "2999-01-01T00:00", env=env).stdout == ""
    bad_since = quinebox("audit", "--since", "yesterday-ish", env=env)
    assert bad_since.returncode == 2 and "neither a time" in bad_since.stderr
    verified = quinebox("audit", "verify", env=env)
    assert (verified.returncode, verified.stdout) == (0, "intact: 2 record(s)\n")
    edit_one_byte_of(log.path)
    verified = quinebox("audit", "verify", env=env)
    assert verified.returncode == 1 and verified.stdout.startswith("record 0: ")


def edit_one_byte_of(path):
    data = bytearray(path.read_bytes())
    data[data.index(b"mem:1g") + 4] = ord("2")
    path.write_bytes(bytes(data))


def test_what_cannot_be_recorded_before_it_happens_does_not_happen_and_what_already_happened_is_said_once(tmp_path, monkeypatch, capsys):
    from quinebox.audit import log as audit_log
    from quinebox.errors import ErrorKind, StateError

    (tmp_path / "audit").write_text("a file where the audit dir should be")
    monkeypatch.setenv("QUINEBOX_STATE_DIR", str(tmp_path))
    monkeypatch.setattr(audit_log, "_LOSING", threading.Event())
    with pytest.raises(StateError) as unwritable:
        audit_log.record("box_created", "s1")
    assert (unwritable.value.kind, dict(unwritable.value.fields)) == (ErrorKind.STORAGE, {"what": "the audit log"})
    assert isinstance(unwritable.value.cause, OSError)  # what the filesystem said, kept for --traceback
    audit_log.note("box_ended", "s1", exit=0)
    audit_log.note("box_ended", "s2", exit=0)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("quinebox: cannot write the audit log") and err.endswith("audit records are being lost\n")

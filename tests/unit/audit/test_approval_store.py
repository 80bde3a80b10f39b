"""Asking without a terminal: a request waits in the state dir; `quinebox approve`/`deny` from other processes answer it.

The asking side is the real Approver (what a root quinebox runs); the
answering side is the real `quinebox` command in processes of its own.
"""

import json
import os
import signal
import subprocess
import threading
import time

import pytest
from commands import QUINEBOX

from quinebox.audit import approvals
from quinebox.audit.approvals import Approver
from quinebox.audit.asks import Asks
from quinebox.audit.log import AuditLog
from quinebox.audit.request import Request


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("QUINEBOX_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def cli(*args):
    return subprocess.run([QUINEBOX, *args], capture_output=True, text=True, timeout=60)


def approver(project="/srv/project", timeout="60"):
    return Approver(Asks.parse(["net:*"], (), timeout, cwd=project), terminal=False)


def request(subject="net:example.com:443", session="box1", **facts):
    return Request(session, "egress", subject, {"host": "example.com", "port": 443, **facts})


class Asking:
    """A request being decided on a thread of this process, as a box's connection waits on one."""

    def __init__(self, who, req, time_left=None):
        self.decision = None
        self.request = req
        self.thread = threading.Thread(target=lambda: setattr(self, "decision", who.decide(req, time_left)), daemon=True)
        self.thread.start()

    def pending_id(self, within=10.0):
        until = time.monotonic() + within
        while time.monotonic() < until:
            ids = [e["id"] for e in approvals.pending()]
            if self.request.id in ids:
                return self.request.id
            time.sleep(0.05)
        raise AssertionError("the request never became pending")

    def result(self, within=10.0):
        self.thread.join(within)
        assert not self.thread.is_alive(), "still waiting"
        return self.decision


def kinds(state):
    return [(r["kind"], r["facts"].get("allowed"), r["facts"].get("by", "")[:4]) for r in AuditLog(state / "audit").records()]


def test_approve_from_another_process_allows_once_and_the_same_request_is_asked_again(state):
    who = approver()
    first = Asking(who, request())
    listed = cli("approvals", "--json")
    entry = json.loads(listed.stdout.splitlines()[0])
    assert entry["id"] == first.pending_id() and entry["subject"] == "net:example.com:443" and entry["facts"]["host"] == "example.com"
    assert cli("approve", entry["id"][:5]).returncode == 0
    decision = first.result()
    assert (decision.allowed, decision.scope, decision.by.startswith("cli:")) == (True, "once", True)
    again = Asking(who, request())
    again.pending_id()
    assert cli("deny", again.request.id).returncode == 0
    assert again.result().allowed is False
    assert approvals.pending() == []
    assert kinds(state) == [("approval_asked", None, ""), ("approval_decided", True, "cli:"), ("approval_asked", None, ""), ("approval_decided", False, "cli:")]


def test_session_approval_covers_the_same_subject_in_the_same_session_only(state):
    who = approver()
    asking = Asking(who, request())
    cli("approve", asking.pending_id(), "--session")
    assert asking.result().scope == "session"
    assert who.decide(request()).by == "allowed earlier in this session"
    other = Asking(who, request(session="box2"))
    other.pending_id()  # another box's session is asked
    cli("deny", other.request.id)
    assert other.result().allowed is False


def test_always_is_remembered_for_the_project_until_revoked(state):
    asking = Asking(approver(), request())
    assert cli("approve", asking.pending_id(), "--always").returncode == 0
    assert asking.result().scope == "always"
    later = approver().decide(request())  # a later run: not asked
    assert (later.allowed, later.by.startswith("remembered (cli:")) == (True, True)
    remembered = cli("approvals", "--remembered", "--json")
    assert [json.loads(line)["rule"] for line in remembered.stdout.splitlines()] == ["net:example.com:443"]
    elsewhere = Asking(approver(project="/srv/other"), request())  # another project directory is asked
    cli("deny", elsewhere.pending_id())
    assert elsewhere.result().allowed is False
    assert cli("revoke", "net:example.com:443").returncode == 0
    assert cli("revoke", "net:example.com:443").returncode == 1
    asked_again = Asking(approver(), request())
    cli("deny", asked_again.pending_id())
    assert asked_again.result().allowed is False
    assert "approval_revoked" in [k for k, _, _ in kinds(state)]


def test_a_remembered_deny_wins_over_a_remembered_allow(state):
    approvals.remember("net:example.com:443", allow=True, project=None, by="test")
    approvals.remember("net:example.com:443", allow=False, project="/srv/project", by="test")
    assert approver().decide(request()).allowed is False
    assert approver(project="/srv/other").decide(request()).allowed is True


def test_deny_always_from_the_cli_is_remembered(state):
    asking = Asking(approver(), request())
    cli("deny", asking.pending_id(), "--always", "--global")
    assert asking.result().allowed is False
    assert approver(project="/anywhere").decide(request()).by.startswith("remembered")


def test_no_one_to_ask_with_a_zero_timeout_denies_at_once_and_records_it(state):
    began = time.monotonic()
    decision = approver(timeout="0").decide(request())
    assert time.monotonic() - began < 0.5
    assert (decision.allowed, decision.by) == (False, "timeout (--ask-timeout 0)")
    assert approvals.pending() == []
    assert kinds(state) == [("approval_asked", None, ""), ("approval_decided", False, "time")]


def test_an_unanswered_request_is_denied_at_its_deadline_or_the_boxs_end(state):
    began = time.monotonic()
    assert approver(timeout="1").decide(request()).by == "timeout"
    assert 0.9 < time.monotonic() - began < 3
    began = time.monotonic()
    assert approver(timeout="5m").decide(request(), time_left=0.5).by == "timeout"  # never past the box's own time
    assert time.monotonic() - began < 2


def test_a_decision_for_another_request_under_the_same_id_is_no_decision(state):
    asking = Asking(approver(timeout="2"), request())
    pending_id = asking.pending_id()
    forged = {"id": pending_id, "digest": "0" * 64, "allow": True, "scope": "once", "global": False, "by": "cli:forger"}
    (state / "audit" / "decided").mkdir(exist_ok=True)
    (state / "audit" / "decided" / f"{pending_id}.json").write_text(json.dumps(forged))
    assert asking.result().by == "timeout"


def test_an_approver_killed_and_started_again_still_sees_and_decides_the_request(state):
    watcher = subprocess.Popen([QUINEBOX, "approvals", "--wait", "--json"], stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    watcher.send_signal(signal.SIGKILL)  # the approver dies before anything is asked
    watcher.wait()
    asking = Asking(approver(), request(mission="fix it"))
    asking.pending_id()
    watcher = subprocess.Popen([QUINEBOX, "approvals", "--wait", "--json"], stdout=subprocess.PIPE, text=True)
    entry = json.loads(watcher.stdout.readline())
    watcher.send_signal(signal.SIGKILL)  # and again, after it saw the request
    watcher.wait()
    assert entry["facts"]["mission"] == "fix it"
    again = cli("approvals", "--json")
    assert json.loads(again.stdout)["id"] == entry["id"]
    assert cli("approve", entry["id"]).returncode == 0
    assert asking.result().allowed is True


def test_a_request_whose_asker_is_gone_is_no_longer_pending(state):
    (state / "audit" / "pending").mkdir(parents=True)
    dead = subprocess.run(["true"])
    gone = subprocess.Popen(["true"])
    gone.wait()
    entry = {"id": "deadbeef", "session": "s", "kind": "egress", "subject": "net:x:1", "facts": {}, "digest": "d", "pid": gone.pid, "since": "t"}
    (state / "audit" / "pending" / "deadbeef.json").write_text(json.dumps(entry))
    assert dead.returncode == 0 and approvals.pending() == []
    refused = cli("approve", "deadbeef")
    assert refused.returncode == 125
    assert refused.stderr == "quinebox: no pending request with id 'deadbeef': `quinebox approvals` lists them\n"


@pytest.mark.parametrize(
    ("asker", "kept"),
    [
        (lambda me, gone: {"owner": me["owner"]}, True),
        (lambda me, gone: {"owner": f"{me['host']}:{me['pid']}:1"}, False),  # this pid, but a process started at another time: reused
        (lambda me, gone: {"owner": gone["owner"]}, False),
        (lambda me, gone: {"owner": "elsewhere:1:1"}, True),  # another host's asker: this host cannot tell, so it waits
        (lambda me, gone: {"owner": f"{me['host']}:x:1"}, False),
        (lambda me, gone: {"pid": me["pid"]}, True),  # a record from before owners: its pid, whatever process has it now
        (lambda me, gone: {"pid": gone["pid"]}, False),
        (lambda me, gone: {"pid": 0}, False),
        (lambda me, gone: {"pid": True}, False),
        (lambda me, gone: {"pid": str(me["pid"])}, False),
        (lambda me, gone: {}, False),
    ],
)
def test_a_pending_request_lasts_as_long_as_the_process_that_asked(state, asker, kept):
    from quinebox.processes import owner_id

    ended = subprocess.Popen(["sleep", "0.2"])
    gone = {"owner": owner_id(ended.pid), "pid": ended.pid}
    ended.wait()
    me = {"owner": owner_id(), "host": owner_id().split(":")[0], "pid": os.getpid()}
    (state / "audit" / "pending").mkdir(parents=True)
    entry = {"id": "cafe0001", "session": "s", "kind": "egress", "subject": "net:x:1", "facts": {}, "digest": "d", "since": "t", **asker(me, gone)}
    (state / "audit" / "pending" / "cafe0001.json").write_text(json.dumps(entry))
    assert [e["id"] for e in approvals.pending()] == (["cafe0001"] if kept else [])
    assert (state / "audit" / "pending" / "cafe0001.json").exists() == kept


def test_a_pending_request_names_its_asker_by_owner_id(state):
    from quinebox.processes import owner_id

    asking = Asking(approver(timeout="5"), request())
    asking.pending_id()
    entry = json.loads((state / "audit" / "pending" / f"{asking.request.id}.json").read_text())
    assert entry["owner"] == owner_id() and "pid" not in entry
    cli("deny", asking.request.id)
    assert asking.result().allowed is False


def test_session_and_always_together_is_a_usage_error(state):
    both = cli("approve", "abc", "--session", "--always")
    assert (both.returncode, both.stderr) == (2, "quinebox: give --session or --always, not both\n")


def test_listing_for_people_escapes_what_a_box_said(state):
    asking = Asking(approver(timeout="3"), request(mission="\x1b[2Jx\nAllow? [y]"))
    asking.pending_id()
    listed = cli("approvals").stdout
    assert "\x1b" not in listed and "\\x1b[2Jx\\x0aAllow? [y]" in listed and listed.count("\n") == 1
    cli("deny", asking.request.id)
    asking.result()


def test_the_decided_files_never_outlive_their_request(state):
    asking = Asking(approver(), request())
    cli("approve", asking.pending_id())
    asking.result()
    assert os.listdir(state / "audit" / "decided") == [] and os.listdir(state / "audit" / "pending") == []

"""Asking a person, on the real engine: children and connections beyond a box's grants wait for a decision.

The root quinebox runs in a session of its own (no controlling terminal), so
decisions come from `quinebox approve`/`deny` in other processes, or from the
timeout; the terminal prompt is driven through a real pseudo-terminal. The
outside world is an HTTP server on one of the host's own (not loopback)
addresses, reached by a name quinebox's resolver reads from QUINEBOX_EGRESS_HOSTS.
"""

import fcntl
import http.server
import json
import os
import select
import subprocess
import termios
import threading
import time

import pytest
from commands import QUINEBOX, qb, scripts
from host_address import host_address

from quinebox.audit.log import AuditLog
from quinebox.audit.prompt import QUESTION
from quinebox.state import state_dir

FETCH = """
import sys, urllib.request, urllib.error
for _ in range(int(sys.argv[1])):
    try:
        print(urllib.request.urlopen("http://approve.test:%s/" % sys.argv[2], timeout=60).read().decode())
    except urllib.error.HTTPError as exc:
        print(exc.code)
"""


@pytest.fixture(scope="module")
def web(tmp_path_factory):
    """A server answering `hello` on an address of the host's, and the hosts file that names it approve.test."""

    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "5")
            self.end_headers()
            self.wfile.write(b"hello")

        def log_message(self, *args):
            pass

    address = host_address()
    server = http.server.ThreadingHTTPServer((address, 0), Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    here = tmp_path_factory.mktemp("web")
    here.chmod(0o755)
    (here / "hosts").write_text(f"{address} approve.test\n")
    (here / "fetch.py").write_text(FETCH)
    yield {"port": server.server_address[1], "address": address, "dir": here, "env": {**os.environ, "QUINEBOX_EGRESS_HOSTS": str(here / "hosts")}}
    server.shutdown()


def start(*args, env=None, cwd=None):
    """A root quinebox with no terminal, as in CI or a service."""
    return subprocess.Popen([QUINEBOX, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd, start_new_session=True)


def next_request(within=60.0, after: dict | None = None) -> dict:
    """The first waiting request, or with `after` the first other than it (a decided request is listed until the
    box that asked has taken the decision)."""
    until = time.monotonic() + within
    while time.monotonic() < until:
        listed = [json.loads(line) for line in qb("approvals", "--json").stdout.splitlines()]
        fresh = [request for request in listed if after is None or request["id"] != after["id"]]
        if fresh:
            return fresh[0]
        time.sleep(0.1)
    raise AssertionError("nothing was asked")


def audited(session=None) -> list[dict]:
    return [r for r in AuditLog(state_dir() / "audit").records() if session is None or r["session"] == session]


def test_an_approved_child_starts_and_a_denied_one_exits_125_in_the_box(tmp_path):
    (tmp_path / "notes").write_text("granted by a person\n")
    tmp_path.chmod(0o755)  # the box runs as an unprivileged user
    here = str(tmp_path)
    inner = f"quinebox exec -g rw:{here} -- cat {here}/notes; echo first $?; quinebox exec -g rw:{here} -- true; echo second $?"
    root = start("exec", "-g", "spawn:2", "-g", "depth:1", "--ask", f"rw:{here}", "--", "sh", "-c", inner)
    first = next_request()
    assert (first["kind"], first["subject"]) == ("child", f"a child (exec) with rw:{here}")
    assert first["facts"]["argv"] == ["cat", f"{here}/notes"]
    assert qb("approve", first["id"]).returncode == 0
    second = next_request(after=first)
    assert second["id"] != first["id"] and second["facts"]["argv"] == ["true"]  # allowed once: the next request is asked
    assert qb("deny", second["id"]).returncode == 0
    out, err = root.communicate(timeout=120)
    assert (root.returncode, out) == (0, b"granted by a person\nfirst 0\nsecond 125\n")
    assert b"a person did not approve it (decided by cli:" in err
    session = first["session"]
    kinds = [(r["kind"], r["facts"].get("by", "")) for r in audited(session)]
    assert ("child_allowed", "approval") in kinds and ("child_refused", "") in kinds
    assert [k for k, _ in kinds].count("approval_decided") == 2


def test_a_connection_asked_once_is_asked_again_and_always_is_remembered_until_revoked(web, tmp_path):
    port = str(web["port"])
    args = ("exec", "-g", f"ro:{web['dir']}", "--ask", f"net:{web['address']}:{port}", "--", "python3", f"{web['dir']}/fetch.py")
    root = start(*args, "2", port, env=web["env"], cwd=str(tmp_path))
    first = next_request()
    assert (first["kind"], first["subject"], first["facts"]["address"]) == ("egress", f"net:approve.test:{port}", web["address"])
    qb("approve", first["id"])
    second = next_request(after=first)
    assert second["id"] != first["id"]
    qb("approve", second["id"], "--always")
    out, _ = root.communicate(timeout=120)
    assert out == b"hello\nhello\n"

    later = start(*args, "1", port, env=web["env"], cwd=str(tmp_path))  # a later run, same project: not asked
    assert later.communicate(timeout=120)[0] == b"hello\n"
    assert qb("approvals", "--json").stdout == b""
    assert qb("revoke", f"net:approve.test:{port}").returncode == 0

    again = start(*args, "1", port, env=web["env"], cwd=str(tmp_path))
    denied = next_request()
    qb("deny", denied["id"])
    out, err = again.communicate(timeout=120)
    assert out == b"403\n" and b"not approved" in err
    assert [r["facts"]["allowed"] for r in audited(first["session"]) if r["kind"] == "egress"] == [True, True]
    refusals = [r["facts"] for r in audited(denied["session"]) if r["kind"] == "egress"]
    assert len(refusals) == 1 and refusals[0]["allowed"] is False and "not approved" in refusals[0]["why"]


def test_without_a_terminal_a_zero_ask_timeout_denies_at_once(tmp_path):
    began = time.monotonic()
    done = qb(
        "exec", "-g", "spawn:1", "-g", "depth:1", "--ask", f"rw:{tmp_path}", "--ask-timeout", "0", "--",
        "sh", "-c", f"quinebox exec -g rw:{tmp_path} -- true; echo child $?",
    )
    assert (done.returncode, done.stdout) == (0, b"child 125\n")
    assert time.monotonic() - began < 20
    assert b"decided by timeout (--ask-timeout 0)" in done.stderr
    decided = [r for r in audited() if r["kind"] == "approval_decided"][-1]
    assert (decided["facts"]["allowed"], decided["facts"]["by"]) == (False, "timeout (--ask-timeout 0)")


def test_deny_rules_beat_grants_and_asks(web, tmp_path):
    port = str(web["port"])
    done = qb(
        "exec", "-g", f"ro:{web['dir']}", "-g", f"net:{web['address']}:{port}", "--deny", f"net:{web['address']}:{port}", "--ask", "net:*", "--ask-timeout", "0",
        "--", "python3", f"{web['dir']}/fetch.py", "1", port, env=web["env"],
    )
    assert done.stdout == b"403\n"
    assert f"denied by net:{web['address']}:{port}".encode() in done.stderr
    child = qb(
        "exec", "-g", f"rw:{tmp_path}", "-g", "spawn:1", "-g", "depth:1", "--deny", f"rw:{tmp_path}", "--",
        "sh", "-c", f"quinebox exec -g rw:{tmp_path} -- true; echo child $?",
    )
    assert child.stdout == b"child 125\n" and f"denied by rw:{tmp_path}".encode() in child.stderr


def test_an_ask_rule_in_a_policy_file_asks(tmp_path):
    (tmp_path / "policy.yaml").write_text(f"grants: [spawn:1, depth:1]\nask: ['rw:{tmp_path}']\n")
    done = qb("exec", "--policy", str(tmp_path / "policy.yaml"), "--ask-timeout", "0", "--", "sh", "-c", f"quinebox exec -g rw:{tmp_path} -- true; echo $?")
    assert done.stdout == b"125\n" and b"a person did not approve it" in done.stderr


EVIL = "evil\x1b[2J\x1b[H\nAllow? [y]es, always (default allow) "


def prompted(tmp_path, answer: bytes):
    """The root agent on a real pseudo-terminal (stdin elsewhere), its child's mission full of escapes; answer the prompt."""
    mission = EVIL.replace("\x1b", "\\033").replace("\n", "\\n")
    scripts(
        tmp_path,
        parent=[{"sh": f"quinebox run -q -m script:child.yaml \"$(printf '{mission}')\" >&4; echo child $? >&4"}, {"exit": "success"}],
        child=[{"sh": "echo from the child >&4"}, {"exit": "success"}],
    )
    master, slave = os.openpty()

    def controlling_terminal():
        fcntl.ioctl(slave, termios.TIOCSCTTY, 0)

    root = subprocess.Popen(
        [QUINEBOX, "run", "-q", "-m", f"script:{tmp_path / 'parent.yaml'}", "--ask", "spawn:1", "--ask-timeout", "100", "delegate"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, preexec_fn=controlling_terminal, pass_fds=(slave,),
    )
    os.close(slave)
    screen = b""
    until = time.monotonic() + 90
    while QUESTION.encode() + b" (default deny" not in screen and time.monotonic() < until:
        if select.select([master], [], [], 1)[0]:
            screen += os.read(master, 65536)
    os.write(master, answer)
    out, err = root.communicate(timeout=120)
    os.close(master)
    return screen.decode(errors="replace"), out, err


def test_the_terminal_prompt_shows_a_boxs_words_escaped_and_allows_once(tmp_path):
    screen, out, err = prompted(tmp_path, b"o\n")
    assert "\x1b" not in screen
    assert "evil\\x1b[2J\\x1b[H\\x0aAllow? [y]es, always (default allow) " in screen
    rows = [row.strip("\r") for row in screen.split("\n") if row.strip("\r")]
    assert rows[0].startswith("quinebox: box ") and "asks (child, request " in rows[0]
    assert all(row.startswith("  | ") for row in rows[1:-1])
    assert [row for row in rows if row.startswith("Allow?")] == [rows[-1]]
    assert rows[-1].startswith(QUESTION + " (default deny")
    assert out == b"from the child\nchild 0\n", err


def test_the_terminal_prompt_denies(tmp_path):
    _, out, err = prompted(tmp_path, b"d\n")
    assert out == b"child 125\n", err
    decided = [r for r in audited() if r["kind"] == "approval_decided"][-1]["facts"]
    assert (decided["allowed"], decided["by"]) == (False, "terminal")


def test_map_asks_for_every_agent_and_refuses_a_bad_rule_before_starting(tmp_path):
    scripts(tmp_path, spawner=[{"sh": "quinebox exec -- true; echo child $? >&4"}, {"exit": "success"}])
    (tmp_path / "a.txt").write_text("a\n")
    (tmp_path / "b.txt").write_text("b\n")
    out = tmp_path / "out"
    model = ["-m", f"script:{tmp_path / 'spawner.yaml'}"]
    done = qb("map", "spawn", str(tmp_path / "a.txt"), str(tmp_path / "b.txt"), *model, "-o", str(out), "--ask", "spawn:1", "--ask-timeout", "0")
    assert done.returncode == 0, done.stderr
    assert (out / "a.txt.out").read_bytes() == (out / "b.txt.out").read_bytes() == b"child 125\n"
    bad = qb("map", "spawn", str(tmp_path / "a.txt"), *model, "-o", str(tmp_path / "never"), "--ask", "spawn:lots")
    assert (bad.returncode, bad.stderr) == (125, b"quinebox: bad --ask rule: bad grant 'spawn:lots': spawn takes a whole number above zero (e.g. spawn:64)\n")
    assert not (tmp_path / "never").exists()

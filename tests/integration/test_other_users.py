"""Another local user against a box root made (issue 52): uid 1000, the machine's first account, with no privilege.

A root-made box once ran as host uid 1000 with no user namespace: that account read the box's environ, walked
into its /world through /proc/PID/root, connected to its lifeline (root's broker) and its egress socket there,
and an `--image host` box of root's read that account's private files. Each attack here is made for real, by a
process that runs as uid 1000, and must be refused by the kernel.
"""

import os
import pwd
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from backend_under_test import BACKEND, RUNTIME
from live_boxes import soon

import quinebox
from quinebox.box.backends.oci import idmap

pytestmark = [pytest.mark.root_only]
ATTACKER = 1000
#: A root-made box runs as host ids of quinebox's own (idmap.py) in a user namespace of its own: on runc and on bwrap
#: (auto's choice where usable); not on the engine, nor on gVisor (whose processes are not the host's).
OWN_HOST_IDS = BACKEND == "bwrap" or (BACKEND == "oci" and RUNTIME == "runc")


def as_attacker(code: str, *args: str) -> subprocess.CompletedProcess:
    """Python `code` run as uid 1000 (no groups, no capabilities): what that account may do, the kernel says."""
    def drop() -> None:
        os.setgroups([])
        os.setgid(ATTACKER)
        os.setuid(ATTACKER)

    # The system's python3: ours may lie where only root may go (/root/.pyenv); the attacker runs what it has.
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    return subprocess.run([python, "-I", "-c", code, *args], preexec_fn=drop, capture_output=True, text=True, timeout=60, cwd="/")


def box_processes(marker: str) -> list[int]:
    """Host pids of the processes whose command line holds `marker`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            continue
    return found


def host_uid(pid: int) -> int:
    line = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("Uid:"))
    return int(line.split()[1])


def wait_for(marker: str, timeout: float = 30) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = box_processes(marker)
        if pids:
            return pids
        time.sleep(0.05)
    raise AssertionError(f"no process of the box ({marker}) appeared")


PROBE = r"""
import os, socket, sys
pid = sys.argv[1]
def attempt(what, f):
    try:
        f()
        print(what, "REACHED")
    except PermissionError:
        print(what, "refused")
    except OSError as e:
        print(what, "refused" if e.errno in (1, 13) else f"error {e.errno}")
attempt("environ", lambda: open(f"/proc/{pid}/environ", "rb").read())
attempt("world", lambda: os.listdir(f"/proc/{pid}/root/world"))
def lifeline():
    s = socket.socket(socket.AF_UNIX)
    s.connect(f"/proc/{pid}/root/run/quinebox/host.sock")
attempt("lifeline", lifeline)
attempt("mem", lambda: open(f"/proc/{pid}/mem", "rb").read(1))
"""


@pytest.mark.skipif(not OWN_HOST_IDS, reason="a root-made box has a user namespace and host ids of its own on runc and bwrap only (gVisor's processes are not the host's; the engine's: doctor)")
def test_the_first_account_cannot_reach_into_a_box_root_made(engine, tmp_path):
    marker = f"qb-{uuid.uuid4().hex[:10]}"
    with quinebox.Sandbox(grants=[f"env:SECRET_TOKEN=root-only-{marker}"]) as sb:
        sb.write_file("/world/private.txt", "root's world\n")
        running = sb.Popen(["sh", "-c", f"sleep 300; echo {marker}"])
        try:
            pids = wait_for(marker)
            uids = {host_uid(pid) for pid in pids}
            accounts = {entry.pw_uid for entry in pwd.getpwall()}
            assert uids.isdisjoint(accounts), f"the box's processes run as an account's uid: {uids}"
            (ids,) = {idmap.IdRange((uid - idmap.BASE) // idmap.SPAN) for uid in uids}
            assert uids == {ids.host(1000)}, uids
            probe = as_attacker(PROBE, str(pids[0]))
            assert probe.returncode == 0, probe.stderr
            assert probe.stdout.split("\n")[:4] == ["environ refused", "world refused", "lifeline refused", "mem refused"], probe.stdout
        finally:
            running.kill()
            running.wait()


@pytest.mark.skipif(not OWN_HOST_IDS, reason="a root-made box has host ids of its own on runc and bwrap only")
def test_two_boxes_at_once_have_no_host_id_in_common(engine):
    markers = [f"qb-{uuid.uuid4().hex[:10]}" for _ in range(2)]
    boxes = [quinebox.Popen(["sh", "-c", f"sleep 300; echo {m}"]) for m in markers]
    try:
        uids = [{host_uid(pid) for pid in wait_for(m)} for m in markers]
        assert len(uids[0]) == len(uids[1]) == 1 and uids[0] != uids[1]
        first = [idmap.IdRange((next(iter(u)) - idmap.BASE) // idmap.SPAN) for u in uids]
        assert first[0].slot != first[1].slot
    finally:
        for box in boxes:
            box.kill()
            box.wait()
    # Both boxes gone, their slots are free again (their remains go just after each box's wait returns).
    taken = lambda: {int(name) for name in os.listdir(idmap.BOXES)} if idmap.BOXES.is_dir() else set()  # noqa: E731
    assert not soon(lambda: {ids.slot for ids in first} & taken(), within=5)


@pytest.mark.skipif(not OWN_HOST_IDS, reason="a root-made box has host ids of its own on runc and bwrap only")
def test_a_box_socket_turns_away_a_peer_that_is_neither_the_box_nor_the_host(engine, tmp_path):
    """Even were a box's socket reachable (its mode opened up by hand here), a process of another uid that
    connects is dropped at once, unanswered: the broker checks who connected on every accept."""
    marker = f"qb-{uuid.uuid4().hex[:10]}"
    box = quinebox.Popen(["sh", "-c", f"sleep 300; echo {marker}"])
    try:
        (pid,) = wait_for(marker)[:1]
        sockets = [p for p in Path(os.environ["QUINEBOX_STATE_DIR"], "run").glob("*.sock") if not p.name.startswith(("serve", "pool"))]
        lifeline = next(p for p in sockets if p.stat().st_uid == host_uid(pid))
        assert (lifeline.stat().st_mode & 0o777) == 0o600  # the box's user's alone
        os.chmod(lifeline, 0o666)
        run_dir = lifeline.parent
        mode = run_dir.stat().st_mode
        os.chmod(run_dir, 0o711)
        state = Path(os.environ["QUINEBOX_STATE_DIR"])
        opened = [p for p in (state, *state.parents) if p != Path("/") and not p.stat().st_mode & 0o001]
        saved = {p: p.stat().st_mode for p in opened}
        for p in opened:
            os.chmod(p, saved[p] | 0o001)
        try:
            code = "import socket, sys\ns = socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\ns.settimeout(10)\nprint(repr(s.recv(100)))"
            probe = as_attacker(code, str(lifeline))
        finally:
            for p in opened:
                os.chmod(p, saved[p])
            os.chmod(run_dir, mode)
        assert probe.returncode == 0, probe.stderr
        assert probe.stdout.strip() == "b''", probe.stdout  # connected, then closed by the host without a byte
    finally:
        box.kill()
        box.wait()


@pytest.mark.skipif(not OWN_HOST_IDS, reason="--image host is a runtime's (the engine cannot root a box in the host's files)")
def test_a_host_image_box_root_made_cannot_read_the_first_accounts_private_files(engine):
    private = Path("/opt") / f"qb-private-{uuid.uuid4().hex[:8]}"
    private.mkdir(mode=0o700)
    try:
        (private / "secret").write_text("the first account's\n")
        os.chmod(private / "secret", 0o600)
        os.chown(private, ATTACKER, ATTACKER)
        os.chown(private / "secret", ATTACKER, ATTACKER)
        result = quinebox.exec(["cat", str(private / "secret")], image="host", timeout=60)
        assert result.returncode == 1 and result.stdout == b"", result
        assert b"Permission denied" in result.stderr
    finally:
        for path in (private / "secret", private):
            path.unlink() if path.is_file() else path.rmdir()

"""`quinebox box pause/resume/checkpoint/restore/fork/snapshots`, run as a user runs them, on gVisor."""

import os

import pytest
from commands import qb, wait_for
from live_boxes import cgroups_of, live_boxes

from quinebox.box.backends.oci.boxroot import bundle_of
from quinebox.state import snapshots_dir

#: Counts in memory, and answers the count on a socket it listens on; its world file is held open.
COUNTER = (
    "import socket\nl = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); l.bind(('127.0.0.1', 7777)); l.listen(8)\n"
    "log = open('/world/log', 'a', buffering=1)\nn = 0\n"
    "while True:\n    c, _ = l.accept(); n += 1; log.write(f'{n}\\n'); c.sendall(f'{n}\\n'.encode()); c.close()\n"
)
ASK = ["python3", "-c", "import socket; print(socket.create_connection(('127.0.0.1', 7777), timeout=10).recv(64).decode().strip())"]


def ok(*args: str, timeout: float = 120) -> str:
    done = qb(*args, timeout=timeout)
    assert done.returncode == 0, (args, done.stderr)
    return done.stdout.decode()


def asked(box: str) -> int:
    return int(ok("exec", "--in", box, "--", *ASK))


def left(session: str) -> list[str]:
    """What is left of a box once it is removed: its runtime container, cgroups, bundle, records."""
    found = [f"box {b.id}" for b in live_boxes(None, f"io.quinebox.session={session}")] + cgroups_of(session)
    found += [str(p) for p in (bundle_of(session),) if p.exists()]
    run = os.path.join(os.environ["QUINEBOX_STATE_DIR"], "run", "sandboxes")
    return found + [name for name in (os.listdir(run) if os.path.isdir(run) else []) if name.startswith(session)]


pytestmark = pytest.mark.root_only  # gVisor's boxes are root's alone here (this runsc cannot make a rootless one)


@pytest.fixture
def box():
    session = ok("box", "create", "--runtime", "runsc", "--backend", "oci", "--name", "snap-e2e", timeout=60).strip()
    try:
        done = qb("cp", "-", f"{session}:/world/counter.py", input=COUNTER.encode())
        assert done.returncode == 0, done.stderr
        ok("exec", "--in", session, "--", "sh", "-c", "python3 /world/counter.py > /dev/null 2>&1 < /dev/null &")
        wait_for(lambda: qb("exec", "--in", session, "--", *ASK).returncode == 0, what="the counter listening")
        yield session
    finally:
        qb("box", "rm", session)


def test_pause_refuses_execs_in_one_line_and_resume_goes_on(box):
    assert ok("box", "pause", "snap-e2e").strip() == box
    assert f"{box}  snap-e2e          runsc    paused" in ok("box", "ls")
    for args in (["exec", "--in", box, "--", "true"], ["cp", f"{box}:/world/log", "-"]):
        refused = qb(*args)
        assert (refused.returncode, refused.stdout, refused.stderr) == (125, b"", f"quinebox: box {box} is paused: `quinebox box resume {box}` first\n".encode())
    again = qb("box", "pause", box)
    assert (again.returncode, again.stderr.decode()) == (125, f"quinebox: box {box} is paused already\n")
    assert ok("box", "resume", box).strip() == box
    assert asked(box) > 0 and "running" in ok("box", "ls")


def test_checkpoint_restore_and_fork_print_ids_and_every_copy_goes_on(box):
    counted = asked(box)
    snapshot = ok("box", "checkpoint", box).strip()
    assert len(snapshot) == 12 and snapshot in ok("box", "snapshots") and box in ok("box", "snapshots")
    copies = ok("box", "fork", box, "-n", "2").split()
    restored = ok("box", "restore", snapshot[:6]).strip()
    try:
        assert len(set([box, restored, *copies])) == 4
        for each in (box, restored, *copies):
            # Each goes on from the instant: the counter past what the original had answered, its log whole from 1.
            now = asked(each)
            assert now > counted
            assert ok("exec", "--in", each, "--", "cat", "/world/log").split() == [str(n) for n in range(1, now + 1)]
        ok("exec", "--in", copies[0], "--", "sh", "-c", "echo mine > /world/mine")
        assert qb("exec", "--in", copies[1], "--", "test", "-e", "/world/mine").returncode == 1
        assert snapshot in ok("box", "snapshots") and len(ok("box", "snapshots").splitlines()) == 2  # the fork's own is gone
    finally:
        assert qb("box", "rm", restored, *copies).returncode == 0
    assert ok("box", "snapshots", "rm", snapshot).strip() == snapshot
    assert not (snapshots_dir() / snapshot).exists()
    for each in (restored, *copies):
        wait_for(lambda each=each: not left(each), timeout=15, what=f"box {each} leaving nothing")


def test_what_cannot_be_snapshotted_and_a_changed_snapshot_are_refused_in_one_line(box):
    runc = ok("box", "create", "--runtime", "runc", "--backend", "oci", timeout=60).strip()
    try:
        refused = qb("box", "checkpoint", runc)
        assert refused.returncode == 125 and refused.stderr.decode().startswith(
            f"quinebox: box {runc} runs on runc, whose checkpoints go through CRIU, and CRIU does not work here (`criu check` fails on this kernel: ")
        assert refused.stderr.count(b"\n") == 1 and not refused.stdout
    finally:
        qb("box", "rm", runc)
    snapshot = ok("box", "checkpoint", box).strip()
    with open(snapshots_dir() / snapshot / "world" / "counter.py", "a") as world:
        world.write("# changed\n")
    refused = qb("box", "restore", snapshot)
    assert (refused.returncode, refused.stdout, refused.stderr.decode()) == (
        125, b"", f"quinebox: snapshot {snapshot} is not as it was made: world/counter.py was changed; it is refused\n")
    assert ok("box", "snapshots", "rm", snapshot).strip() == snapshot
    missing = qb("box", "restore", snapshot)
    assert missing.returncode == 125 and missing.stderr.decode() == f"quinebox: no snapshot has an id starting {snapshot!r}: `quinebox box snapshots` lists them\n"


def test_gc_removes_a_snapshot_left_half_made_by_a_process_that_is_gone():
    half = snapshots_dir() / "0123456789ab.making"
    half.mkdir(parents=True)
    (half / "maker").write_text(f"{os.uname().nodename}:999999999:1")
    (half / "image").mkdir()
    done = qb("gc")
    assert done.returncode == 0 and "removed 1 snapshot(s) left half made, or of a fork whose maker is gone: 0123456789ab" in done.stderr.decode()
    assert not half.exists()

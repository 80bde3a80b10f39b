"""Pausing, snapshots and forks of long-lived boxes (quinebox/sandbox.py), on the real runtimes.

A box on gVisor (runsc) is snapshotted here: in every copy, and in the original, a process's in-memory counter,
the file it holds open in /world and the socket it listens on go on from the instant. runc's CRIU fails on this
kernel and the engine's checkpoints are experimental: each is refused in one line, and pausing works on all three.
"""

import json
import os
import time

import pytest
from live_boxes import cgroups_of, live_boxes, soon

import quinebox
from quinebox.box.backends.oci.boxroot import bundle_of
from quinebox.box.live import freezing, snapshots
from quinebox.errors import QuineboxError
from quinebox.view.catalog import Catalog

#: Counts in memory; appends each count to a file it holds open in /world; answers the count on a listening socket.
COUNTER = r"""
import socket
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", 7777))
listener.listen(8)
listener.settimeout(0.05)
log = open("/world/log", "a", buffering=1)
count = 0
while True:
    count += 1
    log.write(f"{count}\n")
    try:
        conn, _ = listener.accept()
        conn.sendall(f"{count}\n".encode())
        conn.close()
    except socket.timeout:
        pass
"""
ASK = ["python3", "-c", "import socket; print(socket.create_connection(('127.0.0.1', 7777), timeout=10).recv(64).decode().strip())"]


def counting(sb: quinebox.Sandbox) -> None:
    """The counter started in the background, everything it holds inside the box (a snapshot carries that)."""
    sb.write_file("/world/counter.py", COUNTER)
    assert sb.exec(["sh", "-c", "python3 /world/counter.py > /dev/null 2>&1 < /dev/null &"]).returncode == 0
    until = time.monotonic() + 30
    while sb.exec(ASK).returncode != 0:
        assert time.monotonic() < until, "the counter never listened"
        time.sleep(0.1)


def count(sb: quinebox.Sandbox) -> int:
    answer = sb.exec(ASK)
    assert answer.returncode == 0, answer.stderr
    return int(answer.stdout)


def logged(sb: quinebox.Sandbox) -> list[int]:
    return [int(line) for line in sb.read_file("/world/log").split()]


def of(session: str) -> list[snapshots.Snapshot]:
    """The snapshots of one box."""
    return [snapshot for snapshot in snapshots.listing() if snapshot.box == session]


def nothing_left_of(session: str, snapshot: str | None = None) -> list[str]:
    left = [f"box {b.id}" for b in live_boxes(None, f"io.quinebox.session={session}")]
    left += cgroups_of(session) + [str(p) for p in (bundle_of(session),) if p.exists()]
    if snapshot is not None and (snapshots.snapshots_dir() / snapshot).exists():
        left.append(f"snapshot {snapshot}")
    return left


@pytest.fixture
def gvisor_box():
    with quinebox.Sandbox(backend="oci", runtime="runsc") as sb:
        counting(sb)
        yield sb


def test_every_copy_goes_on_from_the_instant_with_its_counter_open_file_and_listening_socket(gvisor_box):
    sb = gvisor_box
    copies = sb.fork(2)
    try:
        assert len({sb.id, *(c.id for c in copies)}) == 3
        for box in (sb, *copies):
            counted = count(box)
            lines = logged(box)
            # One process, never restarted: the counter and the open file went on from where they were (a restart
            # would begin again at 1), and the listening socket answers the count it had logged (read after it).
            assert lines == list(range(1, len(lines) + 1)), (box.id, lines[-5:])
            assert 0 < counted <= lines[-1]
        # The copies share everything up to the instant and nothing after: each world is its own.
        instant = min(len(logged(box)) for box in copies)
        assert all(logged(box)[:instant] == list(range(1, instant + 1)) for box in (sb, *copies))
        copies[0].write_file("/world/mine", "only in the first copy")
        assert [box.exec(["test", "-e", "/world/mine"]).returncode for box in (sb, *copies)] == [1, 0, 1]
        assert count(sb) > 0 and sb.exec(["cat", "/world/counter.py"]).stdout.startswith(b"\nimport socket")
    finally:
        for copy in copies:
            copy.close()
    assert not of(sb.id), "a fork's own snapshot outlived the fork"
    for copy in copies:
        assert soon(lambda copy=copy: nothing_left_of(copy.id)) == []


def test_a_snapshot_is_restored_as_a_new_box_any_number_of_times_and_removed_whole(gvisor_box):
    sb = gvisor_box
    snapshot = sb.checkpoint()
    assert snapshot.box == sb.id and snapshot.recipe.runtime == "runsc" and snapshot.size > 0
    assert [s.id for s in of(sb.id)] == [snapshot.id]
    first, second = quinebox.Sandbox.restore(snapshot.id), quinebox.Sandbox.restore(snapshot.id[:6])
    try:
        assert count(first) > 0 and count(second) > 0 and count(sb) > 0
        assert first.exec(["cat", "/world/counter.py"]).stdout == sb.exec(["cat", "/world/counter.py"]).stdout
        assert first.diagnostics() == "" and sb.diagnostics() == ""
        view = Catalog()  # the view shows each box's time revised, from the audit log
        try:
            moments = {box.id: [{k: v for k, v in m.items() if k != "t"} for m in view.sessions.tree(box.id)["nodes"][0]["moments"]] for box in (sb, first)}
        finally:
            view.close()
        assert moments == {
            sb.id: [{"what": "snapshot", "snapshot": snapshot.id, "bytes": snapshot.size, "transient": False}],
            first.id: [{"what": "restored", "snapshot": snapshot.id, "box": sb.id}],
        }
    finally:
        first.close()
        second.close()
    snapshots.remove(snapshots.find(snapshot.id))
    for box in (first, second):
        assert soon(lambda box=box: nothing_left_of(box.id, snapshot.id)) == []


def test_a_paused_box_stops_its_processes_and_its_clock_and_refuses_execs_in_one_line():
    with quinebox.Sandbox(backend="oci", runtime="runsc", ttl=3) as sb:
        counting(sb)
        sb.pause()
        assert sb.paused
        with pytest.raises(QuineboxError, match=rf"^box {sb.id} is paused: `quinebox box resume {sb.id}` first$"):
            sb.exec(["true"])
        time.sleep(4)  # past its TTL, paused: its clock stood still
        assert sb.returncode is None
        sb.resume()
        assert not sb.paused and count(sb) > 0
        assert sb.wait(10) != 0  # and runs out once what was left of it has passed


@pytest.mark.parametrize("options", [{"backend": "oci", "runtime": "runc"}, {"backend": "docker"}], ids=["runc", "docker"])
def test_pause_works_everywhere_and_a_checkpoint_is_refused_in_one_line_where_it_cannot_be_taken(options):
    expected = {
        "runc": "runs on runc, whose checkpoints go through CRIU, and CRIU does not work here (`criu check` fails on this kernel: ",
        "docker": "runs on the Docker engine, whose checkpoints need its experimental mode (off here: `dockerd --experimental`) and CRIU",
    }["runc" if options["backend"] == "oci" else "docker"]
    with quinebox.Sandbox(**options) as sb:
        # each count written aside and renamed over /tmp/n: a read never meets the file truncated and not yet written
        sb.exec(["sh", "-c", "(i=0; while true; do i=$((i+1)); echo $i > /tmp/n.next; mv /tmp/n.next /tmp/n; sleep 0.02; done) > /dev/null 2>&1 < /dev/null &"])
        time.sleep(0.3)
        sb.pause()
        with pytest.raises(QuineboxError, match=r"is paused: `quinebox box resume "):
            sb.read_file("/tmp/n")
        time.sleep(0.3)
        sb.resume()
        before = int(sb.read_file("/tmp/n"))
        time.sleep(0.3)
        assert int(sb.read_file("/tmp/n")) > before
        with pytest.raises(QuineboxError) as refused:
            sb.checkpoint()
        assert str(refused.value).startswith(f"box {sb.id} {expected}") and "\n" not in str(refused.value)
        sb.pause()  # and a paused box is removed all the same
    assert soon(lambda: nothing_left_of(sb.id), within=10) == []


def test_what_a_snapshot_cannot_carry_is_refused_by_name_and_the_box_goes_on(gvisor_box):
    sb = gvisor_box
    # A background process that kept an exec's stdout holds a file of the host's, which gVisor cannot restore.
    started = sb.Popen(["sh", "-c", "sleep 600 & echo started"], stdout=quinebox.PIPE)
    assert started.stdout.readline() == b"started\n" and started.wait(30) == 0
    with pytest.raises(QuineboxError) as refused:
        sb.checkpoint()
    said = str(refused.value)
    assert said.startswith(f"box {sb.id} cannot be snapshotted now: gVisor restores no file of the host's but the box's own stdio, and pid ")
    assert "(sleep 600) holds files of the host's as fd 1, 2 (an exec's stdin, stdout or stderr): end it, or start it with its output" in said
    assert "\n" not in said and count(sb) > 0 and not freezing.pause_of(sb.id) and not of(sb.id)
    kill = "import os; [os.kill(int(p), 9) for p in os.listdir('/proc') if p.isdigit() and open(f'/proc/{p}/cmdline', 'rb').read() == b'sleep\\x00600\\x00']"
    assert sb.exec(["python3", "-c", kill]).returncode == 0
    started.stdout.close()
    snapshots.remove(sb.checkpoint())  # once it is gone


def test_a_world_holding_a_fifo_of_the_hosts_is_refused_by_name(tmp_path):
    """A FIFO the box makes in /world is gVisor's own (the host's world has none, the image carries it); one
    copied in from the host (--world-from) is a host FIFO, which no snapshot copies."""
    os.mkfifo(tmp_path / "fifo")
    with quinebox.Sandbox(backend="oci", runtime="runsc", world_from=[str(tmp_path / "fifo")]) as sb:
        with pytest.raises(QuineboxError, match=rf"^box {sb.id} cannot be snapshotted now: its world holds a FIFO at /world/fifo, which a snapshot cannot copy; remove it first$"):
            sb.checkpoint()
        assert sb.exec(["true"]).returncode == 0 and not of(sb.id)


def test_a_tampered_snapshot_or_another_users_is_refused_and_nothing_starts(gvisor_box):
    snapshot = gvisor_box.checkpoint()
    image = snapshot.path / "image" / "checkpoint.img"
    with open(image, "r+b") as data:
        data.seek(4096)
        byte = data.read(1)
        data.seek(4096)
        data.write(bytes([byte[0] ^ 1]))
    with pytest.raises(QuineboxError, match=rf"^snapshot {snapshot.id} is not as it was made: image/checkpoint.img was changed; it is refused$"):
        quinebox.Sandbox.restore(snapshot.id)
    manifest = snapshot.path / "manifest.json"
    sealed = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**sealed, "recipe": {**sealed["recipe"], "grants": ["rw:/"]}}))
    with pytest.raises(QuineboxError, match=rf"^snapshot {snapshot.id} is not as it was made: its manifest was changed"):
        quinebox.Sandbox.restore(snapshot.id)
    manifest.write_text(json.dumps({**sealed, "uid": 4242}))
    with pytest.raises(QuineboxError, match=rf"^snapshot {snapshot.id} was made by another user \(uid 4242\): only they may use it$"):
        quinebox.Sandbox.restore(snapshot.id)
    manifest.write_text(json.dumps(sealed))
    os.chown(snapshot.path, 4242, 4242)
    try:
        with pytest.raises(QuineboxError, match=rf"^snapshot {snapshot.id} was made by another user \(uid 4242\)"):
            quinebox.Sandbox.restore(snapshot.id)
    finally:
        os.chown(snapshot.path, os.getuid(), os.getgid())
        snapshots.remove(snapshot)
    assert [box.labels.get("io.quinebox.restore-image") for box in live_boxes(None)] == [None]


def test_the_mcp_tools_pause_checkpoint_restore_and_fork_a_box_and_its_end_removes_what_they_made():
    pytest.importorskip("mcp")
    from quinebox.integrations.mcp_server import QuineboxMCP

    server = QuineboxMCP(["mem:512m"], runtime="runsc", backend="oci")
    try:
        made = server.create_sandbox()
        box = server.box(made["box"])
        counting(box)
        assert server.pause_sandbox(made["box"]) == {"box": box.id, "paused": True, "look": made["look"]}
        assert server.list_sandboxes()["boxes"][0]["paused"] is True
        with pytest.raises(QuineboxError, match="is paused: `quinebox box resume"):
            server.exec(made["box"], argv=["true"])
        server.resume_sandbox(made["box"])
        taken = server.checkpoint_sandbox(made["box"])
        restored = server.restore_sandbox(taken["snapshot"][:5], ttl="10m")
        assert restored["from"] == taken["snapshot"] and restored["files"] == ["/world"]
        forked = server.fork_sandbox(made["box"], copies=2)
        assert len(forked["copies"]) == 2
        for each in (restored["box"], *forked["copies"]):
            assert server.exec(each, argv=ASK)["exit_code"] == 0
        assert [s["snapshot"] for s in server.list_snapshots()["snapshots"]] == [taken["snapshot"]]
        sessions = [made["box"], restored["box"], *forked["copies"]]
    finally:
        server.close()
    assert not (snapshots.snapshots_dir() / taken["snapshot"]).exists()
    for session in sessions:
        assert soon(lambda session=session: nothing_left_of(session), within=10) == []

"""Attached Sandboxes on the default backend: `Sandbox.detached` (a box with a holder process of its own) and
`Sandbox.connect` (from another process), whose execs the box's owner runs, whose `close()` only lets go, and
whose `destroy()` ends the box."""

import asyncio
import os
import resource
import socket
import subprocess
import sys
import time

import pytest
from live_boxes import live_boxes, soon

import quinebox
from quinebox import QuineboxError
from quinebox.audit.log import AuditLog
from quinebox.box.live import controls, holders

PY = sys.executable


@pytest.fixture
def running(engine):
    """Whether the box of `session` runs, as its backend lists it."""
    return lambda session: any(box.labels.get("io.quinebox.session") == session for box in live_boxes(engine))


def test_a_detached_box_outlives_its_handle_is_reached_from_another_process_and_destroy_ends_it(running):
    sb = quinebox.Sandbox.detached(ttl="3m", idle=None)
    try:
        assert sb.attached and sb.returncode is None
        sb.write_file("/world/f", b"\x00from the first\xff")
        sb.close()  # lets go only
        assert running(sb.id)
        probe = (
            "import sys, quinebox\n"
            f"sb = quinebox.Sandbox.connect({sb.id!r})\n"
            "r = sb.exec(['sh', '-c', 'cat /world/f; echo $X; pwd; cat; exit 3'], input=b'in', env={'X': 'x'}, cwd='/tmp')\n"
            "sys.stdout.buffer.write(r.stdout); sb.close(); sys.exit(r.returncode)\n"
        )
        done = subprocess.run([PY, "-c", probe], capture_output=True, timeout=60)
        assert (done.returncode, done.stdout) == (3, b"\x00from the first\xffx\n/tmp\nin"), done.stderr
        again = quinebox.Sandbox.connect(sb.id)
        assert again.exec(["true"]).returncode == 0 and running(sb.id)
        again.destroy()
        assert again.returncode == 137 and not running(sb.id)
        with pytest.raises(QuineboxError, match="not running"):
            again.exec(["true"])
        with pytest.raises(QuineboxError, match="no long-lived box"):
            quinebox.Sandbox.connect(sb.id)
    finally:
        if running(sb.id):
            quinebox.Sandbox.connect(sb.id).destroy()


def test_an_attached_exec_is_run_by_the_owner_times_out_alone_and_caps_its_output():
    with quinebox.Sandbox() as owner:
        sb = quinebox.Sandbox.connect(owner.id)
        assert sb.attached and not owner.attached
        result = sb.exec(["sh", "-c", "sleep 30 & echo started; wait"], timeout=1)
        assert (result.returncode, result.timed_out, result.stdout) == (124, True, b"started\n")
        big = sb.exec(["sh", "-c", "head -c 200000 /dev/zero; echo end >&2"], max_output=100)
        assert (big.returncode, big.truncated, len(big.stdout), big.stderr) == (0, True, 100, b"end\n")
        assert sb.exec(["sh", "-c", "echo $PPID"]).stdout.strip() == owner.exec(["sh", "-c", "echo $PPID"]).stdout.strip()  # the box's init forked both
        sb.write_file("/world/g", b"g")
        assert [i.name for i in sb.listdir("/world")] == ["g"]
        sb.close()
        assert owner.exec(["cat", "/world/g"]).stdout == b"g"  # the owner's box goes on


def test_pause_and_resume_of_an_attached_box_go_through_its_owner():
    with quinebox.Sandbox() as owner:
        sb = quinebox.Sandbox.connect(owner.id)
        sb.pause()
        assert owner.paused and sb.paused
        with pytest.raises(QuineboxError, match="paused"):
            sb.exec(["true"])
        sb.resume()
        assert sb.exec(["echo", "on"]).stdout == b"on\n"


def test_async_twins_detach_connect_and_destroy(running):
    async def main():
        sb = await quinebox.Sandbox.adetached(idle=None, ttl="2m")  # from a worker thread: the holder is spawned, not forked
        try:
            other = await quinebox.Sandbox.aconnect(sb.id)
            await other.amkdir("/world/d/e")
            assert [i.type for i in await other.alistdir("/world/d")] == ["dir"]
            assert (await other.astat("/world/d/e")).type == "dir"
            await other.aremove("/world/d", recursive=True)
            assert (await other.aexec(["ls", "/world"])).stdout == b""
        finally:
            await sb.adestroy()
        return sb.id

    session = asyncio.run(main())
    assert soon(lambda: [session] if running(session) else []) == []


def test_connect_refuses_what_is_not_there():
    with pytest.raises(QuineboxError, match="no long-lived box"):
        quinebox.Sandbox.connect("no-such-box-anywhere")


def test_destroy_ends_a_detached_box_and_its_holder_process(running):
    """Its owner (the holder) removes the box the one way every box is removed, then exits: nothing is left running,
    and nothing was killed through the runtime's listing (which a loaded machine can miss a box in)."""
    sb = quinebox.Sandbox.detached(ttl="3m")
    pid = int(sb._record.owner.split(":")[1])  # "host:pid:start" of the process that holds the box
    before = sum(1 for _ in AuditLog().records())
    sb.destroy()
    assert not running(sb.id)
    assert not soon(lambda: _alive(pid), within=10), f"the holder {pid} still runs"
    assert _killed(sb.id, before) == [], "destroy killed the box itself: its owner was never asked"


def test_destroy_of_a_box_whose_owner_cannot_be_asked_stops_its_holder_and_kills_it(running):
    """An owner that cannot be asked (its control socket gone, as a box made by an older quinebox has none): its
    holder is told to stop and the box killed as `quinebox box rm` does; both go."""
    sb = quinebox.Sandbox.detached(ttl="3m")
    pid = int(sb._record.owner.split(":")[1])
    controls.control_path(sb.id).unlink()
    before = sum(1 for _ in AuditLog().records())
    sb.destroy()
    assert not running(sb.id)
    assert not soon(lambda: _alive(pid), within=10), f"the holder {pid} still runs"
    assert [r["facts"]["asked_for"] for r in _killed(sb.id, before)] == [sb.id]


def _killed(session: str, since: int) -> list[dict]:
    """The kill records of `session` the audit log took after its first `since` records."""
    return [r for r in list(AuditLog().records())[since:] if r["kind"] == "kill" and r["session"] == session]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_a_sandbox_closed_while_the_interpreter_exits_does_not_hang_it(running):
    """A framework that closes its box in a __del__ (run while Python shuts down, its threads gone) exits at once,
    and the box goes with the process."""
    probe = (
        "import quinebox\n"
        "class Env:\n"
        "    def __del__(self):\n"
        "        self.sb.close()\n"
        "env = Env()\n"
        "env.sb = quinebox.Sandbox(ttl='3m')\n"
        "print(env.sb.id, flush=True)\n"
    )
    done = subprocess.run([PY, "-c", probe], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    session = done.stdout.decode().strip()
    assert not soon(lambda: running(session), within=20), f"box {session} still runs"


def _running_in(sb, words: str) -> bool:
    """Whether a process of the box runs a command line holding `words`."""
    probe = f"for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -v grep | grep -c '{words}'"
    return sb.exec(["sh", "-c", probe]).stdout.strip() not in (b"", b"0")


def test_async_twins_have_threads_of_their_own_past_asyncios_default_executor():
    """As many blocking aexecs as asyncio's default executor has threads (min(32, cpus + 4)) do not stall a file op of
    the same loop: it runs at once, and its file ends their wait."""
    waiters = min(32, (os.cpu_count() or 1) + 4) + 1

    async def main(sb):
        wait = ["sh", "-c", "for i in $(seq 200); do [ -e /world/go ] && exit 0; sleep 0.05; done; exit 1"]
        running = [asyncio.create_task(sb.aexec(wait, timeout=30)) for _ in range(waiters)]
        while not _running_in(sb, "seq 200") and not all(task.done() for task in running):
            await asyncio.sleep(0.05)
        began = time.monotonic()
        await sb.awrite_file("/world/go", b"")
        took = time.monotonic() - began
        return took, [result.returncode for result in await asyncio.gather(*running)]

    with quinebox.Sandbox(grants=["pids:256"]) as sb:
        took, codes = asyncio.run(main(sb))
    assert codes == [0] * waiters
    assert took < 5, f"awrite_file waited {took:.1f} s behind {waiters} aexecs"


@pytest.mark.parametrize("attached", [False, True], ids=["owned", "attached"])
def test_a_cancelled_aexec_kills_its_command(attached):
    with quinebox.Sandbox() as owner:
        sb = quinebox.Sandbox.connect(owner.id) if attached else owner

        async def main():
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(sb.aexec(["sleep", "31"]), 1)
            return soon(lambda: _running_in(owner, "sleep 31"), within=10)  # looked at before the loop ends

        assert not asyncio.run(main()), "the cancelled command runs on"


def test_poll_of_an_attached_exec_whose_socket_is_past_fd_1023():
    """A process with many sandboxes has fds past select()'s 1024: poll() of an attached exec answers there too."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1600:
        pytest.skip(f"this process may open {hard} files only")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1600), hard))
    try:
        with quinebox.Sandbox() as owner:
            sb = quinebox.Sandbox.connect(owner.id)
            proc = sb.Popen(["sh", "-c", "read x"], stdin=subprocess.PIPE)
            high = os.dup2(proc._conn.fileno(), 1500)  # its very connection to the owner, at an fd as many sandboxes give it
            proc._conn.close()
            proc._conn = socket.socket(fileno=high)
            assert proc.poll() is None
            proc.stdin.close()
            assert soon(lambda: proc.poll() is None, within=10) is False
            assert proc.returncode == 1  # read at end of input
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_holder_that_says_nothing_is_an_error_by_its_deadline():
    read_end, write_end = os.pipe()  # a holder that keeps its report open and never says a word
    try:
        began = time.monotonic()
        with pytest.raises(QuineboxError, match="did not say within 0.3 s"):
            holders.told(read_end, timeout=0.3)
        assert time.monotonic() - began < 2
    finally:
        os.close(write_end)

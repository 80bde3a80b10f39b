"""One exec's own pids cgroup below its box's: what the exec started is what it lists, and nothing in a box can
leave a cgroup (a box sees no cgroupfs it may write), so killing what it lists ends the exec's whole tree.

And the watchdog a CLI process leaves beside an exec it runs for a box another process owns (`exec --in`),
which kills that tree if the CLI dies first: a runtime's exec would otherwise outlive a client killed by SIGKILL.

And what the host reads of any box's cgroups, whichever backend made them: where a process is, how often the
kernel killed a process for memory there, and whether moving a box's first process into them waits here.
"""

from __future__ import annotations

import os
import select
import signal
import time
from pathlib import Path

from quinebox.box.backends.rootless import MOUNTS
from quinebox.box.policy import CGROUP_PREFIX
from quinebox.errors import EngineError

#: The exit status of an exec whose tree was killed (as a shell reports SIGKILL).
EXIT_KILLED = 137
#: Where the host finds cgroup v1's pids hierarchy; without it the host is on cgroup v2 alone.
PIDS_V1 = Path("/sys/fs/cgroup/pids")
UNIFIED = Path("/sys/fs/cgroup")
#: An exec's own cgroup, below its box's: the name says it is quinebox's.
EXEC_PREFIX = "quinebox-exec-"
#: Where each cgroup hierarchy says how often the kernel killed a process for memory (v1, then v2).
_OOM_FILES = (("/sys/fs/cgroup/memory", "memory.oom_control"), ("/sys/fs/cgroup", "memory.events"), ("/sys/fs/cgroup/unified", "memory.events"))


class ExecCgroup:
    """One exec's pids cgroup below its box's; every process it lists is the exec's."""

    def __init__(self, box_cgroup: str):
        self.name = EXEC_PREFIX + os.urandom(4).hex()
        base = PIDS_V1 if PIDS_V1.is_dir() else UNIFIED
        self.path = base / box_cgroup.lstrip("/") / self.name
        try:
            self.path.mkdir()
        except OSError as exc:
            raise EngineError(f"cannot make a cgroup for the command in the box ({exc.strerror}): is the box still running?") from None

    @property
    def runtime_arg(self) -> str:
        """`exec --cgroup`'s form: one v1 controller's sub-cgroup, or v2's."""
        return f"pids:{self.name}" if PIDS_V1.is_dir() else self.name

    def pids(self) -> list[int]:
        try:
            return [int(pid) for pid in (self.path / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def busy(self) -> bool:
        return bool(self.pids())

    def kill(self) -> None:
        """SIGKILL until empty: what forks meanwhile is born inside and killed on the next pass (pids limits it)."""
        for _ in range(100):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.005)

    def remove(self) -> None:
        """Gone once empty; an exec's background processes keep it (and go with their box, whose removal takes it)."""
        try:
            self.path.rmdir()
        except OSError:
            pass


def box_cgroup(session: str) -> str:
    """The cgroup every OCI box of quinebox's gets (policy.oci_config's cgroupsPath): a rootless box's lies in
    the cgroup delegated to its user (backends/rootless.py)."""
    from quinebox.box.backends.oci.policy import Rootless
    from quinebox.box.backends.rootless import local_rootless

    who = local_rootless()
    parent = who.cgroup.rstrip("/") if isinstance(who, Rootless) else ""
    return f"{parent}/{CGROUP_PREFIX}{session}"


def cgroup_of(pid: int, controller: str = "pids") -> str:
    """The `controller` cgroup `pid` is in (its v1 hierarchy's line where this host mounts one, else v2's), as the
    host's path below the hierarchy's root: an exec's pids cgroup goes below it; a box's OOM count is read in its memory one."""
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(",") and Path("/sys/fs/cgroup", controller).is_dir():
            return path
    return next(line.split(":", 2)[2] for line in lines if line.startswith("0::"))


def oom_kills(cgroup: str) -> int:
    """How many processes the kernel killed for memory in `cgroup` (its path below each hierarchy's root)."""
    for root, name in _OOM_FILES:
        try:
            text = Path(root, cgroup.lstrip("/"), name).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    return 0


def watchdog(cgroup: ExecCgroup) -> int:
    """A forked process that kills the exec's tree when this process dies before telling it the exec ended.

    For `quinebox exec --in`, whose runtime exec would otherwise outlive a client killed by SIGKILL. Returns
    the fd to write one byte to (then close) once the exec has ended by itself.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's life is checked from the outside (tests/e2e)
        try:
            os.close(write_end)
            os.setsid()
            for fd in range(3):
                os.dup2(os.open(os.devnull, os.O_RDWR), fd)
            select.select([read_end], [], [])
            if not os.read(read_end, 1):
                cgroup.kill()
            cgroup.remove()
        finally:
            os._exit(0)
    os.close(read_end)
    return write_end


def waiting_moves(mounts: str, release: str) -> str | None:
    """When a move into a cgroup waits here for an RCU grace period (~10 ms; the first move of a box's start, on bwrap
    and runc alike: the kernel takes its threadgroup lock for writing), how to stop it; None when it does not wait.

    From /proc/self/mounts' text and the kernel's release: it waits from Linux 6.0 on unless a cgroup hierarchy is
    mounted with `favordynmods` (the lock is global: cgroup2's option serves the v1 hierarchies beside it too), which
    costs each fork and exit a little instead. v1's mounts take the option only at boot (Linux 6.7 on)."""
    version = tuple(int(part) if part.isdigit() else 0 for part in release.split("-")[0].split(".")[:2])
    cgroups = [fields for fields in (line.split() for line in mounts.splitlines()) if len(fields) > 3 and fields[2] in ("cgroup", "cgroup2")]
    if version < (6, 0) or not cgroups or any("favordynmods" in fields[3].split(",") for fields in cgroups):
        return None
    unified = next((fields[1] for fields in cgroups if fields[2] == "cgroup2"), None)
    if unified is not None:
        return f"as root: mount -o remount,favordynmods {unified}  (until the next boot; or boot with cgroup_favordynmods=true, Linux 6.7 on)"
    return "boot with cgroup_favordynmods=true (Linux 6.7 on)"


def local_waiting_moves() -> str | None:
    """waiting_moves of this machine (OSError when its mounts cannot be read)."""
    with open(MOUNTS) as mounts:
        return waiting_moves(mounts.read(), os.uname().release)

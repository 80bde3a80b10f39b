"""A bwrap box's own cgroup in every hierarchy it needs, written directly: bwrap places no process in a cgroup.

A runtime makes a box's cgroup and puts its init there before the init runs; bwrap does neither, so its starter
(box.py) makes the cgroup here with its limits written, places bwrap's child (the box's PID 1) in it while it waits
on bwrap's block fd, and only then lets the box's command run. Its name is a runc box's (`quinebox-<session>`, as
oci/policy.py's cgroupsPath says it): at the top of each hierarchy as root, below the user's delegated cgroup for a
plain user (backends/rootless.py: setup-user's `quinebox.user-UID` on v1, systemd's user@UID.service on v2).

Hierarchies: on v1 (and a hybrid host, v1 controllers beside the unified v2 one at /sys/fs/cgroup/unified) the
memory, pids, cpu and freezer controllers' own, and the unified one's where it is there to be made (it holds no
controller on a hybrid host, but a box's processes are listed and counted there as runc's are); on v2 alone, the one
unified cgroup, its controllers enabled by its parent (root's by systemd; a delegated subtree's by rootless.py's check).
Limits follow OCI's `resources` as policy.py's BwrapBox gives them (memory and memory+swap in bytes, pids, cpu
quota per period). OOM: the memory cgroup's oom_kill count, read by exec_cgroups.oom_kills, as a runc box's is.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from typing import Any

from quinebox.box.backends.exec_cgroups import oom_kills
from quinebox.box.backends.oci.freezer import freeze_cgroup
from quinebox.box.backends.rootless import local_hierarchy
from quinebox.errors import EngineError

CGROUPS = "/sys/fs/cgroup"
#: The v1 controllers a box's cgroup is made in: its limits (memory, pids, cpu) and its pause (freezer).
V1_CONTROLLERS = ("memory", "pids", "cpu", "freezer")
#: Of those, the ones a box cannot run without: its limits live there.
V1_NEEDED = ("memory", "pids")
#: How long a kill waits for a box's processes to leave its cgroup.
KILL_WITHIN = 5.0

#: This machine's hierarchies, looked at once a process (a served exec's worker inherits the server's): which
#: controllers are mounted where does not change while quinebox runs, and each box would read /proc/self/mounts again.
_found: tuple[tuple[str, str], ...] | None = None


def hierarchies() -> tuple[tuple[str, str], ...]:
    """(name, directory) of each hierarchy a box's cgroup is made in here: "unified" alone on v2; on v1 or a hybrid
    host each of V1_CONTROLLERS mounted, and the unified hierarchy when there is one."""
    global _found
    if _found is None:
        if local_hierarchy() == "v2":
            _found = (("unified", CGROUPS),)
        else:
            found = [(name, f"{CGROUPS}/{name}") for name in V1_CONTROLLERS if os.path.exists(f"{CGROUPS}/{name}/cgroup.procs")]
            if os.path.exists(f"{CGROUPS}/unified/cgroup.procs"):
                found.append(("unified", f"{CGROUPS}/unified"))
            _found = tuple(found)
    return _found


class BoxCgroup:
    """One box's cgroup: `path` (relative to each hierarchy's root, e.g. `/quinebox-SESSION`) in each of `dirs`
    (name, directory)."""

    def __init__(self, path: str, dirs: list[tuple[str, str]]):
        self.path = path
        self.dirs = dirs

    @classmethod
    def make(cls, path: str, resources: dict[str, Any]) -> BoxCgroup:
        """The box's cgroup made in each hierarchy whose parent is there (a plain user's delegated one, or the
        root), its limits written; EngineError (nothing left made) where a limit's controller refuses or is missing."""
        rel = path.strip("/")
        made: list[tuple[str, str]] = []
        group = cls(path, made)
        try:
            found = hierarchies()
            for name, base in found:
                directory = f"{base}/{rel}"
                try:
                    os.mkdir(directory)
                except FileExistsError:
                    pass  # a box of this session whose remains were not removed yet: its cgroup is taken over
                except OSError as exc:
                    if not os.path.isdir(os.path.dirname(directory)):
                        if name in V1_NEEDED:
                            raise EngineError(f"cannot make the box's cgroup: {os.path.dirname(directory)} is not there (`quinebox doctor` says how to get it)") from None
                        continue
                    if name in V1_NEEDED or name == "unified" and len(found) == 1:
                        raise EngineError(f"cannot make the box's cgroup {directory}: {exc.strerror}") from None
                    continue  # a hierarchy the box's limits do not live in, not writable here (a plain user's unified one)
                made.append((name, directory))
            group._limit(resources)
        except BaseException:
            group.remove()
            raise
        return group

    @classmethod
    def at(cls, path: str) -> BoxCgroup:
        """The box's cgroup as it is: in each hierarchy where it is there."""
        rel = path.strip("/")
        return cls(path, [(name, f"{base}/{rel}") for name, base in hierarchies() if os.path.isdir(f"{base}/{rel}")])

    def _dir(self, name: str) -> str | None:
        return next((directory for n, directory in self.dirs if n == name), None)

    def _limit(self, resources: dict[str, Any]) -> None:
        memory, pids, cpu = resources.get("memory") or {}, resources.get("pids") or {}, resources.get("cpu")
        v1_memory, v1_pids, v1_cpu, unified = self._dir("memory"), self._dir("pids"), self._dir("cpu"), self._dir("unified")
        if v1_memory is not None:
            if memory.get("limit"):
                _write(f"{v1_memory}/memory.limit_in_bytes", memory["limit"])
            if memory.get("swap") and os.path.exists(f"{v1_memory}/memory.memsw.limit_in_bytes"):
                _write(f"{v1_memory}/memory.memsw.limit_in_bytes", memory["swap"])
        elif memory.get("limit"):
            _write(_need(unified, "memory.max"), memory["limit"])
            if memory.get("swap") and os.path.exists(f"{unified}/memory.swap.max"):
                _write(f"{unified}/memory.swap.max", max(0, int(memory["swap"]) - int(memory["limit"])))
        if v1_pids is not None:
            if pids.get("limit"):
                _write(f"{v1_pids}/pids.max", pids["limit"])
        elif pids.get("limit"):
            _write(_need(unified, "pids.max"), pids["limit"])
        if cpu:
            if v1_cpu is not None:
                _write(f"{v1_cpu}/cpu.cfs_period_us", cpu["period"])
                _write(f"{v1_cpu}/cpu.cfs_quota_us", cpu["quota"])
            else:
                _write(_need(unified, "cpu.max"), f"{cpu['quota']} {cpu['period']}")

    def place(self, pid: int) -> None:
        """`pid` moved into the box's cgroup in every hierarchy; EngineError when one refuses."""
        for _, directory in self.dirs:
            _write(f"{directory}/cgroup.procs", pid)

    def pids(self) -> list[int]:
        """Every process in the box's cgroup (in any of its hierarchies)."""
        found: set[int] = set()
        for _, directory in self.dirs:
            try:
                fd = os.open(f"{directory}/cgroup.procs", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                found.update(int(line) for line in _read_all(fd).split())
            except (OSError, ValueError):
                continue
            finally:
                os.close(fd)
        return sorted(found)

    def oom_kills(self) -> int:
        """How many of the box's processes the kernel killed for memory."""
        return oom_kills(self.path)

    def freeze(self) -> None:
        """Every process of the box stopped (the freezer's own wait for it); EngineError when it cannot be."""
        self._freezer(frozen=True)

    def thaw(self) -> None:
        self._freezer(frozen=False)

    def _freezer(self, *, frozen: bool) -> None:
        freeze_cgroup(self.path, frozen=frozen, who="the box")

    def kill(self) -> None:
        """Every process of the box SIGKILLed (thawed first: a frozen v1 process dies only once thawed), until none
        is left or KILL_WITHIN passes."""
        if not self.pids():
            return
        try:
            self.thaw()
        except EngineError:
            pass  # no freezer here, or one that is not frozen: nothing to thaw
        until = time.monotonic() + KILL_WITHIN
        while (left := self.pids()) and time.monotonic() < until:
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.002)

    def remove(self) -> bool:
        """The box's cgroup removed in every hierarchy (its processes killed first); True when none is left."""
        self.kill()
        left = []
        for name, directory in self.dirs:
            until = time.monotonic() + KILL_WITHIN
            while True:
                try:
                    os.rmdir(directory)
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or time.monotonic() > until:
                        left.append((name, directory))
                        break
                    time.sleep(0.002)  # its last processes still exiting
        self.dirs = left
        return not left


def _need(directory: str | None, name: str) -> str:
    if directory is None or not os.path.exists(f"{directory}/{name}"):
        raise EngineError(f"cannot limit the box: no {name} in its cgroup here (its controller is not enabled for it)")
    return f"{directory}/{name}"


def _read_all(fd: int) -> bytes:
    data = b""
    while chunk := os.read(fd, 65536):
        data += chunk
    return data


def _write(path: str, value: object) -> None:
    """`value` written to a cgroup's file in one write(2), as the kernel takes it (no buffered text file's churn)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, str(value).encode())
        finally:
            os.close(fd)
    except OSError as exc:
        raise EngineError(f"cannot set the box's cgroup: writing {value} to {path} failed ({exc.strerror})") from None

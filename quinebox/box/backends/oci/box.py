"""One box on an OCI runtime: its bundle, its creation with the caller's file descriptors, its exit and its removal.

The runtime is handed the box's stdin, stdout and stderr themselves, so the box's process reads and writes them
with no relay in between: every channel is byte-exact and runs at pipe speed. `runtime run --detach` leaves once the
box's init runs, and the init is reparented to this process (a child subreaper while it starts a box), which waits for it: its exit
status is the box's. An OOM kill is read from the box's memory cgroup before `runtime delete` removes it.

The keeper (backends/keeper.py) is told of each box before it is made, and removes whatever this process still holds
when this process dies, SIGKILL included.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from quinebox.box.backends import keeper
from quinebox.box.backends.exec_cgroups import oom_kills
from quinebox.box.backends.oci import boxroot, idmap
from quinebox.box.backends.oci.boxroot import IMAGE_ROOT, bundle_of, remove_box, remove_bundle
from quinebox.box.backends.oci.runtime import QUICK_TIMEOUT, Runtime, container_id, sandbox_death
from quinebox.box.policy import LABEL_PREFIX
from quinebox.box.streams.console import ConsoleSocket, console_path
from quinebox.errors import EngineError

PR_SET_CHILD_SUBREAPER = 36

#: (exit status, OOM-killed, why the sandbox itself died, if it did)
Ended = Callable[[int, bool, "str | None"], None]
#: The exit statuses of a sandbox that died: killed by a limit of the host's (137), or failed (125).
EXIT_KILLED, EXIT_FAILED = 137, 125
#: How a sandbox's kernel says the host refused it a resource (a process past the pids cgroup, memory). The last is
#: gVisor's mm panicking on an address space whose stub process the host refused to start (its activation failed
#: first, and the sentry used it anyway: what the panic log's first line says under a pids limit, at times).
_EXHAUSTED = ("resource temporarily unavailable", "cannot allocate memory", "out of memory", "failed to create new os thread", "trying to use inactive address space")

#: How long the keeper's kill of a lost holder's box may take.
SWEEP_TIMEOUT = 10.0
#: Boxes that have ended and are being removed: a process lets them finish before it exits (finish_removals).
_leaving: set[OciBox] = set()
#: The boxes this process made and holds, by container id (`held`).
_held: dict[str, OciBox] = {}
#: The annotation that has a box restored from a checkpoint's image (the directory it names) rather than run.
RESTORE_IMAGE = LABEL_PREFIX + "restore-image"
_reaping = 0  # boxes being started right now: while any is, this process is a child subreaper
_reaping_lock = threading.Lock()


@contextlib.contextmanager
def subreaper() -> Iterator[None]:
    """While a box is started, orphaned descendants — its init once the runtime's run leaves, runsc's sandbox
    and gofer — become this process's children, to wait for; at no other time, so that no other orphan of this
    process's (a daemon one of its children started, say) is left a zombie here instead of going to init."""
    global _reaping
    with _reaping_lock:
        if _reaping == 0:
            _prctl_subreaper(1)
        _reaping += 1
    try:
        yield
    finally:
        with _reaping_lock:
            _reaping -= 1
            if _reaping == 0:
                _prctl_subreaper(0)


def _prctl_subreaper(on: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, on, 0, 0, 0) != 0:
        raise EngineError(f"cannot wait for boxes of an OCI runtime: prctl(PR_SET_CHILD_SUBREAPER) failed ({os.strerror(ctypes.get_errno())})")


def hold(runtime: Runtime, cid: str, bundle: str) -> None:
    """Tell the keeper of a box about to be made on `runtime`: it removes the box if this process dies first."""
    keeper.hold("oci", cid, bundle=bundle, runtime=runtime.argv())


def release(cid: str) -> None:
    """The box is removed: the keeper forgets it."""
    keeper.release(cid)


def _sweep(told: dict[str, Any]) -> None:
    """In the keeper, for a holder that died: kill and remove its box (a box's root it died before detaching
    included); one the runtime would not delete stays listed, for `quinebox gc`."""
    runtime, cid, bundle = [str(a) for a in told["runtime"]], str(told["hold"]), str(told.get("bundle") or "")
    try:
        subprocess.run([*runtime, "kill", "--all", cid, "KILL"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=SWEEP_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired):
        pass
    remove_box(runtime, cid, Path(bundle) if bundle else None)


keeper.sweeps("oci", _sweep)


def held(cid: str) -> OciBox | None:
    """The box of container id `cid` if this process made it and it has not been removed: only its maker waits
    for its init, so only its maker may have a checkpoint end its sandbox and a successor take over (`succeed`)."""
    return _held.get(cid)


_runtimes: dict[str, Runtime] = {}


def oci_runtime(name: str) -> Runtime:
    """The runtime of this name, found once per process."""
    if name not in _runtimes:
        _runtimes[name] = Runtime.named(name)
    return _runtimes[name]


@atexit.register
def finish_removals() -> None:
    """Wait for the boxes that have ended to be removed (a runtime delete each, ~10 ms), rather than leave them
    to the keeper, which would kill and delete each once more. A command server's worker, which leaves with
    os._exit, calls it once it has told its client the exit status."""
    until = time.monotonic() + QUICK_TIMEOUT
    for box in list(_leaving):
        box._removed.wait(max(0.0, until - time.monotonic()))


def reap(pids: list[int], grace: float = 2.0) -> None:
    """Wait for processes that are ours (reparented to this subreaper) and on their way out; kill what lingers."""
    until = time.monotonic() + grace
    for pid in pids:
        while True:
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    break
            except ChildProcessError:
                break
            if time.monotonic() > until:
                os.kill(pid, signal.SIGKILL)
                until = time.monotonic() + grace
            time.sleep(0.005)


def died(reason: str, config: dict[str, Any]) -> tuple[int, str]:
    """(exit status, one line) for a sandbox whose kernel died of `reason`: never its bare status (a Go panic's 2)."""
    if any(words in reason.lower() for words in _EXHAUSTED):
        host = config.get("linux", {}).get("resources", {}).get("pids", {}).get("limit")
        return EXIT_KILLED, (
            f"gVisor's sandbox died: the host refused it a resource ({reason}); the box was killed. Its own helper "
            f"processes may number {host} on the host: busy boxes need many; a lower pids: grant or the runc runtime fits"
        )
    return EXIT_FAILED, f"gVisor's sandbox died: {reason}; the box was killed (`quinebox doctor` checks runsc)"


class OciBox:
    """A box created and started on `runtime`; `ended(exit_code, oom_killed, died)` is called once it has exited.

    Its remains (the runtime's state, its cgroup, the bundle) are removed right after, on the same thread, within
    milliseconds: before this process exits (finish_removals), or by the keeper if it dies first."""

    def __init__(
        self, runtime: Runtime, session: str, config: dict[str, Any], *, stdio: tuple[int, int, int], ended: Ended, console: Callable[[int], None] | None = None
    ):
        """`console`: with a terminal, given the master of the box's pty (its stdin, stdout and stderr)."""
        self.runtime = runtime
        self.id = container_id(session)
        self.pid: int | None = None
        self._pidfd: int | None = None
        #: The runtime's own processes left to us with the box (runsc's gofer): reaped when it ends, or the
        #: runtime's delete waits for them to go.
        self._helpers: list[int] = []
        self._pidfd_lock = threading.Lock()  # never signal through an fd number that was closed and reused
        self._ended = ended
        self._removed = threading.Event()
        self._cgroup = config.get("linux", {}).get("cgroupsPath", "")
        self._config = config
        #: While a checkpoint ends the box's sandbox: where the successor's pid comes (None: there is none).
        self._succession: queue.SimpleQueue[int | None] | None = None
        restore = config.get("annotations", {}).get(RESTORE_IMAGE)
        self.bundle = bundle_of(session)
        self.bundle.mkdir(mode=0o700)
        self._ids: idmap.IdRange | None = None
        try:
            image_root = config["root"]["path"]
            # The box's own root over the image's tree (boxroot.py): the runtime makes its mount points there, not in the
            # cache. A rootless box's is made in its own namespace (the config's first mount), a root-made one's here.
            rootless = os.geteuid() != 0 and any(ns["type"] == "user" for ns in config.get("linux", {}).get("namespaces", ()))
            # A root-made box's own ids (idmap.py): its root is mounted where the namespace's root can reach it.
            self._ids = idmap.range_of(config.get("linux", {}).get("uidMappings")) if not rootless else None
            root, mounts = str(self.bundle / boxroot.ROOT), config["mounts"]
            if self._ids is not None:
                root, mounts = boxroot.in_slot(self.bundle, self._ids, mounts)
            own = {**config, "root": {**config["root"], "path": root}, "mounts": mounts, "annotations": {**config.get("annotations", {}), IMAGE_ROOT: image_root}}
            if rootless:
                own["mounts"] = [*boxroot.in_namespace(image_root, self.bundle), *config["mounts"]]
            (self.bundle / "config.json").write_text(json.dumps(own, separators=(",", ":")))
            hold(runtime, self.id, str(self.bundle))
            if not rootless:
                boxroot.layered(image_root, self.bundle, ids=self._ids, mounts=mounts, writable=boxroot.writable_layer(config))
            pid_file = str(self.bundle / "init.pid")
            terminal = ConsoleSocket(console_path(str(self.bundle))) if console else None
            try:
                with subreaper():
                    if restore:
                        runtime.restore(self.id, str(self.bundle), restore, stdio=stdio, pid_file=pid_file)
                    else:
                        runtime.run(self.id, str(self.bundle), stdio=stdio, pid_file=pid_file, console_socket=terminal.path if terminal else None)
                boxroot.detach(self.bundle)  # the box has its root now, in a mount namespace of its own
                self.pid = int(Path(pid_file).read_text())
                if self._ids is not None:
                    idmap.settle(self._ids, session, self.pid)  # its ids are its init's while it lives, whoever made it
                self._pidfd = os.pidfd_open(self.pid)  # ours until we reap it (a zombie of ours if it has exited already)
                self._helpers = runtime.helper_pids(self.id)
                if terminal is not None and console is not None:
                    console(terminal.master())  # queued on the socket while the box was made
            finally:
                if terminal is not None:
                    terminal.close()
        except BaseException:
            self.kill()
            self.remove()  # its root detached with its bundle
            reap([self.pid] if self.pid is not None else [])  # ours (a subreaper's) to reap once dead
            reap(self._helpers)
            raise
        _held[self.id] = self
        threading.Thread(target=self._wait, name=f"oci-wait:{session}", daemon=True).start()

    def _wait(self) -> None:
        assert self.pid is not None
        try:
            code = os.waitstatus_to_exitcode(self._init_status())
        except ChildProcessError:  # not ours after all (something else reaped it): its status is lost, it counts as killed
            code = -signal.SIGKILL
        oom = oom_kills(self._cgroup) > 0
        code = code if code >= 0 else 128 - code
        reason = sandbox_death(str(self.bundle)) if self.runtime.gvisor and not oom else None
        why = None
        if reason is not None:
            code, why = died(reason, self._config)
        with self._pidfd_lock:
            if self._pidfd is not None:
                os.close(self._pidfd)
                self._pidfd = None
        # Every process of the box is gone once its init is reaped (the kernel empties a pid namespace before its
        # init's exit completes), so its caller goes on now; what remains is bookkeeping, removed meanwhile. The
        # bundle goes first (the runtime's delete does not read it): on a full state dir, the caller's next write
        # (an agent's outcome) gets its space back, as it did when the box was removed before its end was told.
        remove_bundle(self.bundle)
        _leaving.add(self)
        try:
            self._ended(code, oom, why)
        finally:
            reap(self._helpers)
            self.remove()

    def pidfd(self) -> int | None:
        """A pidfd of the box's own init, to hand to another process (a warm box's claimer, which kills the box with
        it); None once the init has exited."""
        with self._pidfd_lock:
            return os.dup(self._pidfd) if self._pidfd is not None else None

    def _init_status(self) -> int:
        """The wait status of the box's init; once a checkpoint has ended it for a successor, the successor's."""
        assert self.pid is not None
        while True:
            _, status = os.waitpid(self.pid, 0)
            succession = self._succession
            following = succession.get() if succession is not None else None
            if following is None:
                return status
            self.pid = following

    def succeed(self, image: str, stdio: tuple[int, int, int], meanwhile: Callable[[], None]) -> None:
        """Checkpoint the box into the directory `image`, which ends its sandbox (this runsc always does), call
        `meanwhile()` while nothing of it runs, then restore a successor from the image in the same bundle, as the
        same container, `stdio` its fds 0, 1 and 2: the box goes on in it, waited for here as its init was.
        EngineError when the checkpoint or the restore fails, and then the box has ended; `meanwhile`'s own
        failure is raised once the box goes on."""
        assert self.pid is not None and self.runtime.gvisor
        if boxroot.writable_layer(self._config) is not None:
            raise EngineError("a box granted rootfs:rw cannot be checkpointed: what it wrote to its root is in a layer of the box's own, which gVisor's image does not hold")
        succession: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._succession = succession
        following: int | None = None
        failed: BaseException | None = None
        try:
            self.runtime.checkpoint(self.id, image)
            try:
                meanwhile()
            except Exception as exc:  # noqa: BLE001 the box goes on all the same; its caller hears of it after
                failed = exc
            # The sandbox that wrote the image, and its gofer, go first: they are ours to reap, and the runtime's
            # delete waits 5 s for a process that is still there (a zombie of ours is).
            self.kill()
            reap(self._helpers)
            if not self.runtime.delete(self.id):
                raise EngineError(f"the OCI runtime {self.runtime.name} did not remove the checkpointed sandbox in time")
            for directory in (boxroot.ROOT, boxroot.LAYER):  # left empty when its root was detached after `run`
                (self.bundle / directory).rmdir()
            boxroot.layered(self._config["root"]["path"], self.bundle, ids=self._ids, mounts=self._config["mounts"])
            pid_file = str(self.bundle / "init.pid")
            try:
                with subreaper():
                    self.runtime.restore(self.id, str(self.bundle), image, stdio=stdio, pid_file=pid_file)
            finally:
                boxroot.detach(self.bundle)
            following = int(Path(pid_file).read_text())
            with self._pidfd_lock:
                if self._pidfd is not None:
                    os.close(self._pidfd)
                self._pidfd = os.pidfd_open(following)
            self._helpers = self.runtime.helper_pids(self.id)
        except BaseException:
            self.kill()
            raise
        finally:
            self._succession = None
            succession.put(following)
        if failed is not None:
            raise failed

    def kill(self) -> None:
        """SIGKILL the box's init: the kernel then kills everything else in its pid namespace."""
        with self._pidfd_lock:
            if self._pidfd is not None:
                try:
                    signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
                except OSError:
                    pass  # exited already
                return
        if self.pid is None:
            self.runtime.kill(self.id)

    def signal(self, signum: int) -> None:
        """`signum` to the box's init alone; nothing once it has ended."""
        with self._pidfd_lock:
            if self._pidfd is None:
                return
            if not self.runtime.gvisor:
                try:
                    signal.pidfd_send_signal(self._pidfd, signum)
                except OSError:
                    pass  # exited already
                return
        self.runtime.signal_init(self.id, signal.Signals(signum).name)  # its init is in gVisor's kernel: the runtime's to reach

    @property
    def host_pid(self) -> int | None:
        """The box's init's process id as the host sees it; None under gVisor (the host sees only its sandbox)."""
        return None if self.runtime.gvisor or self._pidfd is None else self.pid

    def remove(self) -> bool:
        """The box and its remains removed (boxroot.remove_box); True only then. One the runtime would not
        delete stays held by the keeper, which tries once more when this process ends, and listed for `gc`."""
        try:
            removed = remove_box(self.runtime.argv(), self.id, self.bundle)
            if removed:
                release(self.id)
            return removed
        finally:
            self._removed.set()
            _leaving.discard(self)
            _held.pop(self.id, None)

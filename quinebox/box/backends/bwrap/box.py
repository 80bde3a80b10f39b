"""One box on bubblewrap: one `bwrap` process, its start placed in its cgroup, its exit and OOM, its record, its removal.

The start, in order (nothing of the box's command runs before its limits hold):

1. the box's record written (`records_dir()/<id>.json`, 0600) and its keeper told of it, its cgroup made with its
   limits (cgroups.py);
2. as root, each host path bwrap binds that the box's unprivileged host ids could not reach (the state dir is
   root's 0700) bound where they can, in the box's own ids' slot (`<slot>/<session>.mnt/N`, idmap.py's 0711
   directories; private mounts), and bwrap's argv pointed there: bwrap opens every source itself, as the box's ids.
   They are detached from the host as soon as bwrap has made the box's mounts (step 5): the box's namespace holds
   copies of its own, so the host keeps no mount of any box's. A copy-on-write world (an agent's child's) is mounted
   by the process that becomes bwrap, in a mount namespace of its own (overlay.py), on an empty directory made here
   (`_world_point`: in the slot, or a plain user's beside the record), removed as those binds are;
3. `bwrap` started with the caller's fds as its 0, 1 and 2 (a terminal's slave instead, with one), its seccomp BPF
   on a memfd, `--info-fd` and `--block-fd`, as the box's own host ids (root) or the caller (a plain user), in a
   session of its own, from the main thread or one long-lived thread of this process: `--die-with-parent` is the kernel's
   PR_SET_PDEATHSIG, which fires when the *thread* that started bwrap ends, so no caller's short-lived thread may;
4. bwrap's info read (the host pid of the box's PID 1, which then waits on the block fd with its mounts made),
   the rlimits and OOM score set on bwrap and on it, it placed in the box's cgroup (bwrap, which only waits for it
   outside the box, stays out, as `runc run` does), the record completed;
5. once bwrap's child waits on the block fd (everything of the box made: /proc/PID/syscall says so; a child that
   exits instead is bwrap's failure, an EngineError, never the box's status), one byte to it: only now does the
   box's command start.

Its exit status is bwrap's (which is its PID 1's, 128+N for a signal's death); an OOM kill is read from its memory
cgroup (137 and its line, as a runc box's). Its remains (cgroup, slot mounts, ids, record) go right after, on the
waiting thread; `remove_remains(record)` is the one way they go, for this process, the keeper, listed.py's destroy
and gc alike. A holder killed by SIGKILL takes its boxes with it (`--die-with-parent`); the keeper (backends/keeper.py,
one for a process tree: a command server's workers tell their server's), told each box's record before the box is
made, removes their remains once that holder has died.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import errno
import json
import os
import queue
import select
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from quinebox.box.backends import keeper
from quinebox.box.backends.bwrap.cgroups import BoxCgroup
from quinebox.box.backends.bwrap.overlay import mounter
from quinebox.box.backends.bwrap.policy import OVERLAY_SOURCE, BwrapBox
from quinebox.box.backends.bwrap.programs import seccomp_program
from quinebox.box.backends.oci import idmap
from quinebox.box.backends.oci.runtime import container_id
from quinebox.errors import EngineError, ErrorKind
from quinebox.processes import pid_alive, process_start_ticks
from quinebox.state import private_dir, private_write, state_dir

#: (exit status, OOM-killed, why the sandbox itself died: never, on bwrap)
Ended = Callable[[int, bool, "str | None"], None]
#: How long bwrap may take to say its box's pid (its namespaces made), and a removal to finish before exit.
START_WITHIN = 10.0
REMOVE_WITHIN = 5.0
#: How long a process that refused its placement may take to be seen to exit: an exiting one (bwrap's child failing to
#: make the box) refuses /proc's writes before its pidfd says so.
EXITING_WITHIN = 0.2
#: bwrap's options that bind a host path (SRC DEST): SRC is opened by bwrap, as whoever runs it.
_BINDS = frozenset({"--bind", "--ro-bind", "--dev-bind", "--bind-try", "--ro-bind-try", "--dev-bind-try"})
#: How many arguments each option of bwrap 0.8 takes (its --help), so that its argv is read as bwrap reads it: an
#: argument (an environment variable's value, a path) is never taken for an option.
_ARITY = {
    **dict.fromkeys(("--unshare-all", "--share-net", "--unshare-user", "--unshare-user-try", "--unshare-ipc", "--unshare-pid", "--unshare-net",
                     "--unshare-uts", "--unshare-cgroup", "--unshare-cgroup-try", "--disable-userns", "--assert-userns-disabled", "--clearenv",
                     "--new-session", "--die-with-parent", "--as-pid-1"), 0),
    **dict.fromkeys(("--args", "--userns", "--userns2", "--pidns", "--uid", "--gid", "--hostname", "--chdir", "--unsetenv", "--lock-file", "--sync-fd",
                     "--remount-ro", "--exec-label", "--file-label", "--proc", "--dev", "--tmpfs", "--mqueue", "--dir", "--seccomp", "--add-seccomp-fd",
                     "--block-fd", "--userns-block-fd", "--info-fd", "--json-status-fd", "--cap-add", "--cap-drop", "--perms", "--size"), 1),
    **dict.fromkeys(("--setenv", "--bind-fd", "--ro-bind-fd", "--file", "--bind-data", "--ro-bind-data", "--symlink", "--chmod", *_BINDS), 2),
}
MS_BIND, MS_REC, MS_PRIVATE = 0x1000, 0x4000, 0x40000
MNT_DETACH, UMOUNT_NOFOLLOW = 0x2, 0x8
_libc = ctypes.CDLL(None, use_errno=True)

#: Boxes that have ended and are being removed: a process lets them finish before it exits (finish_removals).
_leaving: set[BwrapProcess] = set()


def records_dir() -> Path:
    """Where each bwrap box's record lives while it has remains: `<id>.json`."""
    return state_dir() / "bwrap"


def record_path(session: str) -> Path:
    return records_dir() / f"{container_id(session)}.json"


def read_record(path: Path) -> dict[str, Any] | None:
    """A box's record, None when it is gone or not one (a record half-written is never seen: written whole)."""
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("session"), str) else None


def _write_record(record: dict[str, Any]) -> Path:
    path = record_path(record["session"])
    private_dir(path.parent)
    private_write(path, json.dumps(record, separators=(",", ":")).encode())
    return path


def _ids_of(record: dict[str, Any]) -> idmap.IdRange | None:
    ids = record.get("ids")
    first = ids.get("first") if isinstance(ids, dict) else None
    return idmap.holding(first) if isinstance(first, int) else None


def remove_remains(record: dict[str, Any]) -> bool:
    """What a bwrap box leaves, removed: every process still in its cgroup killed, its cgroups removed, the host
    paths bound for it in its ids' slot detached and the ids given back, its record deleted. Idempotent; True once
    nothing is left (a cgroup that will not go keeps the record, for the next try or `quinebox gc`)."""
    session = str(record["session"])
    cgroup = record.get("cgroup")
    removed = BoxCgroup.at(str(cgroup)).remove() if isinstance(cgroup, str) and cgroup else True
    pid, start = record.get("pid"), record.get("start")
    if isinstance(pid, int) and isinstance(start, str) and pid_alive(pid, start):  # outside its cgroup (never placed): killed by its identity
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    ids = _ids_of(record)
    if ids is not None and os.geteuid() == 0:
        _detach(ids, session)
        idmap.release(ids, session)
    _unpoint(_world_point(None, session))
    if removed:
        with contextlib.suppress(FileNotFoundError):
            record_path(session).unlink()
    return removed


# -- a root-made box's host paths, where its own ids reach them ---------------------------------------------------


def _reaches(path: str, uid: int, gid: int) -> bool:
    """Whether uid:gid (with no other group) may walk to `path`, as bwrap run as them resolves it."""
    for candidate in {os.path.abspath(path), os.path.realpath(path)}:
        parent = os.path.dirname(candidate)
        while True:
            try:
                st = os.stat(parent)
            except OSError:
                return False
            bits = 0o100 if st.st_uid == uid else 0o010 if st.st_gid == gid else 0o001
            if not st.st_mode & bits:
                return False
            if parent == "/":
                break
            parent = os.path.dirname(parent)
    return True


def _mounts_dir(ids: idmap.IdRange, session: str) -> Path:
    return Path(f"{ids.root_for(session)}.mnt")


def _open_dir(directory: Path) -> Path:
    """`directory` made 0711 whatever the caller's umask (a map run under umask 077 made it 0700: bwrap, run as the
    box's host ids, could not walk into it to the sources bound there)."""
    directory.mkdir(exist_ok=True)
    os.chmod(directory, 0o711)
    return directory


def _bind(source: str, target: str) -> None:
    for flags, src in ((MS_BIND | MS_REC, source), (MS_PRIVATE | MS_REC, None)):
        if _libc.mount(src.encode() if src else None, target.encode(), None, flags, None) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code), source)


def _options(argv: Sequence[str]) -> Iterator[tuple[int, str]]:
    """(index, name) of each of bwrap's options in its argv (argv[0] its binary), up to `--`."""
    i = 1
    while i < len(argv) and argv[i] != "--":
        if argv[i] not in _ARITY:
            raise EngineError(f"bwrap's command line names an option quinebox does not know: {argv[i]}")
        yield i, argv[i]
        i += 1 + _ARITY[argv[i]]


def reachable(argv: list[str], ids: idmap.IdRange, session: str, host_ids: tuple[int, int], prefixes: Sequence[str] = ()) -> list[str]:
    """bwrap's argv with each bound source the box's host ids could not reach bound in its slot and named there.
    A source below one of `prefixes` (the image's tree) is reached through one mount of that prefix, if need be."""
    out = list(argv)
    mounted: dict[str, str] = {}
    reach = {prefix: _reaches(prefix, *host_ids) for prefix in prefixes}
    for i, name in list(_options(out)):
        if name not in _BINDS:
            continue
        source = out[i + 1]
        prefix = next((p for p in prefixes if source.startswith(p.rstrip("/") + "/")), None)
        if reach[prefix] if prefix is not None else _reaches(source, *host_ids):
            continue  # a path under the image's tree is walked to as its top is: the image's own directories are open
        base = prefix or next((p for p in mounted if source == p or source.startswith(p.rstrip("/") + "/")), source)
        if base not in mounted:
            directory = _open_dir(_mounts_dir(ids, session))
            target = directory / str(len(mounted))
            if os.path.isdir(base):
                target.mkdir(mode=0o700)
            else:
                target.touch(mode=0o600)
            try:
                _bind(base, str(target))
            except OSError as exc:
                raise EngineError(f"cannot give the box {base}: binding it where its host ids reach it failed ({exc.strerror})") from None
            mounted[base] = str(target)
        out[i + 1] = mounted[base] + source[len(base.rstrip("/")):] if source != base else mounted[base]
    return out


def _world_point(ids: idmap.IdRange | None, session: str) -> Path:
    """Where the box's copy-on-write world is mounted, in its own mount namespace (overlay.py), for bwrap to bind: an
    empty directory its host ids may walk to, made here: a root-made box's in its slot (`_detach` removes it with the
    rest there), a plain user's beside its record (`_unpoint`)."""
    if ids is None:
        return records_dir() / f"{container_id(session)}.world"
    return _mounts_dir(ids, session) / "world"


def _make_point(point: Path) -> Path:
    if point.parent != records_dir():
        _open_dir(point.parent)  # a slot's `.mnt`, as reachable() makes it
    else:
        point.parent.mkdir(mode=0o711, exist_ok=True)  # the records' own dir
    with contextlib.suppress(FileExistsError):  # left by a start that died before its remains were removed
        point.mkdir(mode=0o700)
    return point


def _unpoint(point: Path) -> None:
    """A plain user's world mount point removed (from the host's tree: no mount is on it here; removing it detaches
    what another namespace still has mounted on it, never the box's /world, a bind of its own)."""
    with contextlib.suppress(FileNotFoundError):
        point.rmdir()


def _overlaid(argv: list[str], point: str) -> list[str]:
    """bwrap's argv with the copy-on-write world's bind (policy.OVERLAY_SOURCE) from `point`."""
    out = list(argv)
    for i, name in _options(out):
        if name == "--bind" and out[i + 1] == OVERLAY_SOURCE:
            out[i + 1] = point
    return out


def _detach(ids: idmap.IdRange, session: str) -> None:
    directory = _mounts_dir(ids, session)
    for name in idmap.entries(directory):
        target = directory / name
        if _libc.umount2(str(target).encode(), MNT_DETACH | UMOUNT_NOFOLLOW) != 0 and ctypes.get_errno() not in (errno.EINVAL, errno.ENOENT):
            continue  # not ours to detach: the slot stays taken until gc
        with contextlib.suppress(OSError):
            target.rmdir() if target.is_dir() else target.unlink()
    with contextlib.suppress(OSError):
        directory.rmdir()


# -- the one thread that starts every bwrap of this process --------------------------------------------------------


_Job = tuple[dict[str, Any], "queue.SimpleQueue[Any]"]


class _Starter:
    """Runs each bwrap's Popen on one thread that lives as long as any bwrap it started runs: the kernel's
    parent-death signal (`--die-with-parent`) fires when the thread that forked bwrap ends, which a caller's own
    thread may do. With none of its bwraps left it ends too (`done`), so a process holds no thread for no box. The
    main thread starts its bwraps itself (a served exec's worker, the CLI): it ends only with the process, whose
    death is the signal's point, and a thread made and handed each start would only cost its CPU."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] | None = None
        self._pid = -1
        self._mine: set[int] = set()  # the pids of the bwraps the current thread started, not yet reaped
        self._starting = 0  # and the starts handed to it, not answered yet: they hold it too
        self._lock = threading.Lock()

    def popen(self, **kwargs: Any) -> subprocess.Popen[bytes]:
        if threading.current_thread() is threading.main_thread():
            return subprocess.Popen(**kwargs)
        with self._lock:
            if self._pid != os.getpid():  # a forked child has no thread of its parent's
                self._pid, self._jobs, self._mine, self._starting = os.getpid(), None, set(), 0
            if self._jobs is None:
                self._jobs = queue.SimpleQueue()
                threading.Thread(target=self._run, args=(self._jobs,), name="bwrap-starter", daemon=True).start()
            jobs = self._jobs
            self._starting += 1
        answer: queue.SimpleQueue[Any] = queue.SimpleQueue()
        jobs.put((kwargs, answer))
        result = answer.get()
        with self._lock:
            self._starting -= 1
            if not isinstance(result, BaseException):
                self._mine.add(result.pid)
            self._end_if_idle()
        if isinstance(result, BaseException):
            raise result
        return result

    def done(self, proc: subprocess.Popen[bytes]) -> None:
        """`proc` has been reaped: if this starter's thread started it and none of its others is left, the thread
        ends (a new one starts the next)."""
        with self._lock:
            if self._pid == os.getpid() and proc.pid in self._mine:
                self._mine.discard(proc.pid)
                self._end_if_idle()

    def _end_if_idle(self) -> None:
        if not self._mine and not self._starting and self._jobs is not None:
            self._jobs.put(None)
            self._jobs = None

    @staticmethod
    def _run(jobs: queue.SimpleQueue[_Job | None]) -> None:
        while (job := jobs.get()) is not None:
            kwargs, answer = job
            try:
                answer.put(subprocess.Popen(**kwargs))
            except BaseException as exc:  # noqa: BLE001 handed to the caller, who raises it
                answer.put(exc)


_starter = _Starter()


# -- the keeper (backends/keeper.py): what removes a holder's boxes' remains when it dies without removing them -----


def _sweep(told: dict[str, Any]) -> None:
    """In the keeper, for a holder that died: what the box's record (its hold's key) still names goes."""
    record = read_record(Path(str(told["hold"])))
    if record is not None:
        remove_remains(record)


keeper.sweeps("bwrap", _sweep)


@atexit.register
def finish_removals() -> None:
    """Wait for the boxes that have ended to be removed, rather than leave them to the keeper."""
    until = time.monotonic() + REMOVE_WITHIN
    for box in list(_leaving):
        box._removed.wait(max(0.0, until - time.monotonic()))


# -- one box ---------------------------------------------------------------------------------------------------------


def _option(argv: Sequence[str], name: str) -> str | None:
    """The (first) argument of bwrap's option `name`, None where it has none."""
    return next((argv[i + 1] for i, option in _options(argv) if option == name), None)


def _with_fds(argv: list[str], seccomp: int, info: int, block: int) -> list[str]:
    """bwrap's argv with its seccomp fd the one made here, and the info and block fds said first."""
    out = list(argv)
    for i, option in _options(out):
        if option == "--seccomp":
            out[i + 1] = str(seccomp)
    return [out[0], "--info-fd", str(info), "--block-fd", str(block), *out[1:]]


def _readable(fd: int, within: float) -> bool:
    """Whether `fd` is readable (a pidfd: its process has exited) within `within` seconds. poll(2), not select(2): a
    holder of many boxes (an agent's hundred children) has fds past select's 1024."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(within * 1000))


def _read_info(fd: int, proc: subprocess.Popen[bytes]) -> dict[str, Any] | None:
    """bwrap's info JSON (its box's pid and namespaces); None when bwrap ended without saying it."""
    data = b""
    until = time.monotonic() + START_WITHIN
    while time.monotonic() < until:
        if not _readable(fd, max(0.0, until - time.monotonic())):
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
        try:
            info = json.loads(data)
        except ValueError:
            continue
        if isinstance(info, dict) and isinstance(info.get("child-pid"), int):
            return info
    return None


def _binary(name: str, package: str) -> str:
    found = shutil.which(name) or next((p for p in (f"/usr/bin/{name}", f"/bin/{name}") if os.path.exists(p)), None)
    if found is None:
        raise EngineError(f"{name} is not installed here: `apt-get install {package}` (or your system's {package} package)")
    return found


#: bin/boxstart.c as scripts/setup.sh builds it, beside the interpreter: the box's rlimits and (root) its host ids, then bwrap.
BOXSTART = "quinebox-boxstart"


def boxstart() -> str | None:
    """quinebox-boxstart beside this interpreter (a venv's bin, where scripts/setup.sh builds it), None where it is not
    (no C compiler then, or a wheel's install): then util-linux's prlimit and setpriv do what it does."""
    path = os.path.join(os.path.dirname(sys.executable), BOXSTART)
    return path if os.access(path, os.X_OK) and os.path.isfile(path) else None


def _wrapped(argv: list[str], box: BwrapBox, *, tty: bool, as_ids: tuple[int, int] | None, starter: str | None) -> list[str]:
    """bwrap's argv as it is started: under `starter` (quinebox-boxstart, `boxstart()`), which sets the box's rlimits
    on itself and, with `as_ids` (root), becomes the box's own host uid and gid with no supplementary group, then is
    bwrap; with none, util-linux's prlimit and setpriv, which do the same as two execs (~2.5 ms more of each start). A
    limit is set on the starting process itself: on another, it would need CAP_SYS_RESOURCE (a container's root may
    lack it), and a child bwrap forked before its limits were set would lack them. subprocess's
    `user=`/`group=`/`extra_groups=` would change ids too, but make CPython fork the whole interpreter (~2 ms of a
    worker's CPU, its page tables copied) where it otherwise uses vfork. On a terminal, the pty's slave made bwrap's
    controlling terminal (`setsid --ctty`), so that ^C and ^\\ reach the box's foreground processes as the kernel sends
    them, as on a runtime's console; bwrap itself ignores them (`env --ignore-signal`), or its death would kill the
    box, and its box's init takes them back (guest/lifeline.py forwards SIGINT and SIGQUIT, its command starts with both
    at their defaults)."""
    if starter is not None:
        before = [starter, *(f"--rlimit={name}={soft}:{hard}" for name, soft, hard in box.rlimits), *([f"--ids={as_ids[0]}:{as_ids[1]}"] if as_ids else []), "--"]
    else:
        before = [_binary("prlimit", "util-linux"), *(f"--{name}={soft}:{hard}" for name, soft, hard in box.rlimits), "--"]
        if as_ids is not None:
            before += [_binary("setpriv", "util-linux"), f"--reuid={as_ids[0]}", f"--regid={as_ids[1]}", "--clear-groups", "--"]
    if tty:
        before += [_binary("env", "coreutils"), "--ignore-signal=INT", "--ignore-signal=QUIT", _binary("setsid", "util-linux"), "--ctty"]
    return [*before, *argv]


#: The number of read(2) on each architecture bwrap's child may wait on its block fd in (`_waits_on`).
_READ = {"x86_64": 0, "aarch64": 63, "ppc64le": 3, "s390x": 3, "riscv64": 63}


def _waits_on(pid: int, fd: int, pidfd: int) -> bool:
    """Wait until bwrap's child `pid` waits in read(2) on its block fd `fd` (/proc/PID/syscall), its namespaces,
    mounts and ids made: True; False once it has exited instead (bwrap said why on the box's stderr). bwrap makes
    everything of the box before that read; what it does after (its seccomp filter loaded, the working directory,
    the command's exec) is the box's own start."""
    number = _READ.get(os.uname().machine)
    until = time.monotonic() + START_WITHIN
    while time.monotonic() < until:
        try:
            called = Path(f"/proc/{pid}/syscall").read_text().split()
        except OSError:
            called = []
        if len(called) > 1 and called[1] == hex(fd) and (number is None or called[0] == str(number)):
            return True
        if _readable(pidfd, 0.0005):  # readable once it has exited
            return False
    raise EngineError(f"bwrap did not make the box within {START_WITHIN:g} s")


#: The raw syscalls setgroups, setresgid and setresuid on each architecture: made by syscall(2), not glibc's wrappers
#: (which change every thread's), they change the credentials of the calling thread alone.
_SETIDS = {"x86_64": (116, 119, 117), "aarch64": (159, 149, 147), "riscv64": (159, 149, 147), "ppc64le": (81, 169, 164), "s390x": (206, 210, 208)}
#: openat2(2), the same number on every architecture; RESOLVE_IN_ROOT: absolute links resolve in the box's root.
_OPENAT2 = 437
_RESOLVE_IN_ROOT = 0x10


def _cannot_enter(pid: int, workdir: str, as_ids: tuple[int, int] | None) -> int:
    """0 when the box's user may make `workdir` its working directory in the box of bwrap's child `pid` (blocked on
    its block fd: its root and mounts made), else the errno bwrap's own `--chdir` would meet (EACCES, ENOTDIR, ENOENT).
    The path is walked from the child's root (openat2 RESOLVE_IN_ROOT, `workdir/.`: search permission on every
    directory of it, the last included, as chdir(2) asks) by a thread of ours with the box's host ids `as_ids` (as
    root; a plain user's box's ids are the caller's own), so the kernel decides as it would for the box's user."""
    root = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    said: list[int] = []

    def walk() -> None:
        if as_ids is not None:
            groups, setresgid, setresuid = _SETIDS[os.uname().machine]
            uid, gid = (ctypes.c_long(i) for i in as_ids)
            for number, args in ((groups, (ctypes.c_long(0), None)), (setresgid, (gid, gid, gid)), (setresuid, (uid, uid, uid))):
                if _libc.syscall(ctypes.c_long(number), *args) != 0:
                    said.append(ctypes.get_errno())
                    return
        how = ctypes.create_string_buffer(int.to_bytes(os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, 8, "little") + bytes(8)
                                          + int.to_bytes(_RESOLVE_IN_ROOT, 8, "little"), 24)
        fd = _libc.syscall(ctypes.c_long(_OPENAT2), ctypes.c_int(root), os.fsencode(workdir.rstrip("/") + "/."), how, ctypes.c_size_t(24))
        said.append(ctypes.get_errno() if fd < 0 else 0)
        if fd >= 0:
            os.close(fd)

    try:
        looker = threading.Thread(target=walk, name=f"bwrap-workdir:{pid}", daemon=True)  # its ids die with it
        looker.start()
        looker.join(START_WITHIN)
    finally:
        os.close(root)
    return said[0] if said else errno.ETIMEDOUT


def _own_world_open(box: BwrapBox) -> bool:
    """Whether the box's own world (policy's `workdir_ours`), as the host has it, is a directory its user owns and may
    search: then its user enters it, and the walk to it as its user (`_cannot_enter`) is spared. A resumed world its
    last box shut (`chmod 000 /world`) is walked to, and refused in one line, as any other."""
    source = next((box.argv[i + 1] for i, option in _options(box.argv) if option == "--bind" and box.argv[i + 2] == "/world"), None)
    try:
        st = os.stat(source) if source is not None else None
    except OSError:
        return False
    return st is not None and stat.S_ISDIR(st.st_mode) and st.st_uid == box.host_ids[0] and bool(st.st_mode & stat.S_IXUSR)


def _oom_score(pid: int, box: BwrapBox) -> None:
    """The box's OOM score on `pid` (bwrap, or its box's PID 1 before it runs the box's command): raised, never lowered."""
    Path(f"/proc/{pid}/oom_score_adj").write_text(str(box.oom_score_adj))


class BwrapProcess:
    """One running bwrap box (as OciBox is a runtime's); `ended(exit_code, oom_killed, None)` once it has exited,
    then its remains are removed on the same thread."""

    def __init__(
        self, session: str, box: BwrapBox, *, labels: dict[str, str], image_root: str, cgroup_path: str, ids: idmap.IdRange | None,
        stdio: tuple[int, int, int], ended: Ended, terminal: int | None = None, command: Sequence[str] = (),
    ):
        """`terminal`: a pty's slave, the box's 0, 1 and 2 instead of `stdio`; `ids`: a root-made box's own host
        ids (bwrap runs as `box.host_ids`, in that span), None for a plain user's box (run as the caller)."""
        self.id = container_id(session)
        self.session = session
        self.pid: int | None = None
        self._ended = ended
        self._removed = threading.Event()
        self._pidfd: int | None = None
        self._pidfd_lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self.record: dict[str, Any] = {
            "id": self.id, "session": session, "labels": labels, "pid": None, "start": None, "holder_pid": os.getpid(),
            "cgroup": cgroup_path, "image_root": image_root, "made": time.time(), "command": list(command),
            "user": f"{_option(box.argv, '--uid') or 0}:{_option(box.argv, '--gid') or 0}", "cwd": _option(box.argv, "--chdir") or "/",
            "host_ids": list(box.host_ids), "ids": {"first": ids.first, "count": ids.span} if ids is not None else None,
        }
        self._path = _write_record(self.record)
        keeper.hold("bwrap", str(self._path))
        self.cgroup: BoxCgroup | None = None
        fds: list[int] = []
        try:
            self.cgroup = BoxCgroup.make(cgroup_path, box.resources)
            as_root = os.geteuid() == 0
            world = _make_point(_world_point(ids, session)) if box.overlay else None
            argv = _overlaid(box.argv, str(world)) if world is not None else box.argv
            argv = reachable(argv, ids, session, box.host_ids, prefixes=(image_root,)) if ids is not None else argv
            seccomp = os.memfd_create("quinebox-seccomp", os.MFD_CLOEXEC)
            fds.append(seccomp)
            os.write(seccomp, seccomp_program(box.seccomp, box.own_ids))
            os.lseek(seccomp, 0, os.SEEK_SET)
            info_r, info_w = os.pipe()
            block_r, block_w = os.pipe()
            fds += [info_r, info_w, block_r, block_w]
            stdin, stdout, stderr = (terminal, terminal, terminal) if terminal is not None else stdio
            command = _wrapped([_binary("bwrap", "bubblewrap"), *_with_fds(argv, seccomp, info_w, block_r)[1:]], box, tty=terminal is not None,
                               as_ids=box.host_ids if as_root and world is None else None, starter=boxstart())
            if world is not None:  # mounted by the process that becomes bwrap, which then drops to the box's ids itself
                command = [*mounter(box.overlay, str(world), box.host_ids, as_root=as_root), *command]
            self._proc = _starter.popen(
                args=command, stdin=stdin, stdout=stdout, stderr=stderr,
                pass_fds=(seccomp, info_w, block_r), close_fds=True, cwd="/", env={}, start_new_session=terminal is None,
            )
            for fd in (info_w, block_r, seccomp):
                os.close(fd)
                fds.remove(fd)
            info = _read_info(info_r, self._proc)
            if info is None:
                code = self._proc.wait(START_WITHIN)
                raise EngineError(f"bwrap did not start the box (it exited {code}; its own line says why, above)")
            self.pid = int(info["child-pid"])
            with contextlib.suppress(ProcessLookupError):  # gone already: bwrap failed to make it
                self._pidfd = os.pidfd_open(self.pid)
            placed = self._pidfd is not None and self._place(box)
            self.record.update(pid=self.pid, start=process_start_ticks(self.pid))
            _write_record(self.record)
            if ids is not None:
                idmap.settle(ids, session, self.pid)
            if not placed or not _waits_on(self.pid, block_r, self._pidfd):  # type: ignore[arg-type]  # placed: it has one
                code = self._proc.wait(START_WITHIN)
                raise EngineError(f"bwrap could not make the box (it exited {code}): its own line above says why")
            workdir = _option(box.argv, "--chdir") or "/"
            if workdir != "/" and not (box.workdir_ours and _own_world_open(box)) and (refused := _cannot_enter(self.pid, workdir, box.host_ids if as_root else None)):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)  # type: ignore[arg-type]  # placed: it has one. Killed before its block fd closes: it runs nothing, says nothing
                raise EngineError(f"bwrap could not start the box: its user cannot enter its working directory {workdir}: {os.strerror(refused).lower()}; "
                                  "choose another with -w/--workdir, or one the box's user may walk to", kind=ErrorKind.BAD_INPUT, workdir=workdir)
            if ids is not None:  # the box's namespace holds its own copies now: the host keeps no mount of its
                _detach(ids, session)
            elif world is not None:  # bwrap has bound /world: the overlay's mount point goes (overlay.py)
                _unpoint(world)
            os.write(block_w, b"\0")  # the box's command runs from here on, placed
        except BaseException:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            fds = []
            if self._proc is not None:
                with contextlib.suppress(OSError):
                    self._proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(START_WITHIN)
                _starter.done(self._proc)
            self.remove()
            raise
        finally:
            for fd in fds:
                os.close(fd)
        threading.Thread(target=self._wait, name=f"bwrap-wait:{session}", daemon=True).start()

    def _place(self, box: BwrapBox) -> bool:
        """bwrap and its child given the box's OOM score, the child (the box's PID 1, which every process of the box
        comes from) placed in its cgroup: True; False when the child has exited meanwhile (bwrap failed to make the
        box); EngineError when the cgroup refuses a running one.

        bwrap itself, outside the box's namespaces, only waits for its child, as `runc run` waits for `runc init`,
        and stays outside the box's cgroup as runc does: each process moved costs a cgroup migration in every
        hierarchy, which waits for the kernel's RCU grace period (~0.35 ms each, 5 hierarchies on a hybrid host)."""
        assert self._proc is not None and self.cgroup is not None and self.pid is not None and self._pidfd is not None
        try:
            _oom_score(self._proc.pid, box)
            _oom_score(self.pid, box)
            self.cgroup.place(self.pid)
        except (OSError, EngineError):
            if not _readable(self._pidfd, EXITING_WITHIN):  # readable once it has exited (an exiting one refuses the write first)
                raise
            return False
        return True

    def _wait(self) -> None:
        assert self._proc is not None
        code = self._proc.wait()
        _starter.done(self._proc)
        oom = self.cgroup is not None and self.cgroup.oom_kills() > 0
        code = code if code >= 0 else 128 - code
        with self._pidfd_lock:
            if self._pidfd is not None:
                os.close(self._pidfd)
                self._pidfd = None
        _leaving.add(self)
        try:
            self._ended(code, oom, None)
        finally:
            self.remove()

    @property
    def host_pid(self) -> int | None:
        """The box's PID 1 as the host sees it, while it runs."""
        return self.pid if self._pidfd is not None else None

    def kill(self) -> None:
        """SIGKILL the box's PID 1: the kernel then kills everything else in its pid namespace."""
        self.signal(signal.SIGKILL)

    def signal(self, signum: int) -> None:
        """`signum` to the box's PID 1 alone (its init passes the usual ones on); nothing once it has ended."""
        with self._pidfd_lock:
            if self._pidfd is not None:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(self._pidfd, signum)

    def remove(self) -> bool:
        """The box and its remains removed (`remove_remains`); True only then."""
        try:
            removed = remove_remains(self.record)
            if removed:
                keeper.release(str(self._path))
            return removed
        finally:
            self._removed.set()
            _leaving.discard(self)

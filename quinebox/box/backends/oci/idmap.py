"""A root-made box's own user namespace: a range of host ids that no account and no other box holds.

A box root made once ran as host uid 1000 with no user namespace, and uid 1000 is a machine's first account:
that account could read the box's /proc/PID/environ, walk into its /world through /proc/PID/root, reach its
lifeline (root's broker) and its egress socket (root's secrets) there, and ptrace its processes. Now each
root-made box on runc runs in a user namespace of its own, mapped onto a span of host ids carved for it alone,
as podman's `--userns=auto` and Kubernetes' user-namespaced pods do:

- quinebox's range is a subordinate range of a dedicated system user, `quinebox`, written to /etc/subuid and
  /etc/subgid (`register`), so useradd and every other tool that hands out subordinate ids keeps clear of it.
  It starts at 2^30 (above any account a distribution makes, and below 2^31, which some tools read signed).
- a box claims one SPAN of it (a slot: its ids 0…65535 are host ids first…first+65535, its user 1000 is
  first+1000) for as long as it lives, and its children (agents' children, boxes started from inside it) share
  it (`inherited`): they see and change their parent's files (an overlay world over its layers, a rw grant it
  passed on) as their own, as they did when every box was uid 1000, while no other tree and no account has
  those ids. A child a warm box serves (one with nothing of its parent's: box/shape.py's why_cold) has that
  warm box's own. The slot is the directory BOXES/<slot>, made by mkdir (atomic: two trees never get one
  slot), root's and 0711: each box's own root is mounted in it (`root_for`, owned by the slot's first id),
  since the runtime makes that root the box's as the namespace's root, which must reach it (the state dir's
  0700 directories, root's, are closed to it; every bind mount's source the runtime opens itself, as the host's
  root, before it enters the namespace). Each box in it, its tree's root and each child (`join`), has a claim
  file, CLAIM.<session>, naming the process that holds it (the box's init once started: `settle`; until then
  its maker).
- a slot is free again once every box in it is removed (`release`, from boxroot.remove_bundle: its owner, its
  keeper, gc and `box rm` alike), or once every process its claims name is gone and nothing is mounted there
  (`stale`: whoever claims next, and gc, sweep it), so a crash of every process that knew of it leaks nothing
  for long, and a child that outlives its parent keeps its ids its own.

gVisor's boxes need none (their processes are the sandbox's, not the host's), and a rootless box has the
namespace its user's own ids make (oci.policy.Rootless).
"""

from __future__ import annotations

import errno
import fcntl
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

from quinebox.processes import pid_alive, process_start_ticks

#: The dedicated system user whose subordinate range the boxes' ids are.
USER = "quinebox"
#: The range: SLOTS spans of SPAN ids from BASE (2^30 … 2^30 + 2^28: well below 2^31).
BASE = 1 << 30
SPAN = 1 << 16
SLOTS = 4096
#: Where the claims live: /run is a tmpfs, so a restart (which ends every box) frees every slot.
RUN = Path("/run/quinebox")
BOXES = RUN / "boxes"
CLAIM = "claim"
SUBORDINATE_FILES = ("/etc/subuid", "/etc/subgid")


@dataclass(frozen=True)
class IdRange:
    """The host ids of one box's user namespace: its ids 0…SPAN-1 are host ids first…first+SPAN-1."""

    slot: int

    @property
    def first(self) -> int:
        return BASE + self.slot * SPAN

    @property
    def span(self) -> int:
        return SPAN

    def host(self, inside: int) -> int:
        """The host id that the box's id `inside` is."""
        if not 0 <= inside < SPAN:
            raise ValueError(f"id {inside} is outside a box's namespace (0…{SPAN - 1})")
        return self.first + inside

    @property
    def dir(self) -> Path:
        return BOXES / str(self.slot)

    def root_for(self, session: str) -> Path:
        """Where the box of `session` (this slot's or a child's) has its root mounted while the runtime takes it
        (boxroot.layered), and beside it (`.mnt`) what else the host mounts for it."""
        return self.dir / session


def holding(host_id: int) -> IdRange | None:
    """The slot whose span holds the host id `host_id`, if any."""
    slot, _ = divmod(host_id - BASE, SPAN)
    return IdRange(slot) if host_id >= BASE and slot < SLOTS else None


def range_of(mappings: object) -> IdRange | None:
    """The range a config's uidMappings name, when they are one of ours (a root-made box's); else None."""
    if not isinstance(mappings, list) or len(mappings) != 1 or not isinstance(mappings[0], dict):
        return None
    first, size = mappings[0].get("hostID"), mappings[0].get("size")
    ids = holding(first) if isinstance(first, int) and size == SPAN else None
    return ids if ids is not None and ids.first == first else None


def subordinate_line(name: str = USER) -> str:
    return f"{name}:{BASE}:{SLOTS * SPAN}\n"


def overlap(text: str, name: str = USER) -> str | None:
    """The first entry of /etc/subuid's (or subgid's) `text` that is not ours and overlaps our range; else None."""
    end = BASE + SLOTS * SPAN
    for line in text.splitlines():
        fields = line.strip().split(":")
        if len(fields) != 3 or not fields[1].isdigit() or not fields[2].isdigit() or fields[0] == name:
            continue
        start, count = int(fields[1]), int(fields[2])
        if start < end and BASE < start + count:
            return line.strip()
    return None


class IdRangeError(OSError):
    """The range cannot be had here: another's subordinate ids overlap it, or /etc or /run refuses a write."""


_registered = False


def register() -> None:
    """Our range written to /etc/subuid and /etc/subgid, once a machine (the system user too, where useradd is):
    so that no other tool hands its ids out. Refused, never shared, where another entry already holds part of it."""
    global _registered
    if _registered:
        return
    for path in SUBORDINATE_FILES:
        try:
            with open(path) as f:
                text = f.read()
        except FileNotFoundError:
            text = ""
        other = overlap(text)
        if other is not None:
            raise IdRangeError(
                errno.EEXIST,
                f"{path}'s entry {other!r} overlaps quinebox's box ids {BASE}…{BASE + SLOTS * SPAN - 1}: "
                "give that user another range (usermod --del-subuids/--add-subuids)",
            )
        if subordinate_line() not in (text if text.endswith("\n") else text + "\n"):
            try:
                with open(path, "a") as f:
                    f.write(("" if not text or text.endswith("\n") else "\n") + subordinate_line())
            except OSError:
                pass  # a read-only /etc: the range is still used, and useradd's own (below SUB_UID_MAX) is far below it
    _system_user()
    _registered = True


def _system_user() -> None:
    """The dedicated system user the range belongs to (no home, no shell), where the machine has useradd."""
    import pwd
    import subprocess

    try:
        pwd.getpwnam(USER)
        return
    except KeyError:
        pass
    useradd = shutil.which("useradd") or ("/usr/sbin/useradd" if os.path.exists("/usr/sbin/useradd") else None)
    if useradd is not None:
        subprocess.run([useradd, "--system", "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", USER],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30, check=False)


def _dirs() -> None:
    """/run/quinebox and its boxes/, root's and traversable only (0711): a box's root reaches its own slot by name."""
    for path in (RUN, BOXES):
        try:
            path.mkdir(mode=0o711)
        except FileExistsError:
            pass
        st = os.lstat(path)
        if st.st_uid != 0 or not os.path.isdir(path) or os.path.islink(path) or st.st_mode & 0o022:
            raise IdRangeError(errno.EPERM, f"{path} is not root's own directory (owner {st.st_uid}, mode {oct(st.st_mode & 0o777)}): remove it")
        os.chmod(path, 0o711)


def claim(session: str, prefer: IdRange | None = None) -> IdRange:
    """A slot of its own for the box of `session`, held by this process until `settle` names the box's init;
    `prefer`'s where it is free (a resumed session's last: what its boxes wrote to its grants stays theirs)."""
    usable()
    _dirs()
    with _locked():
        register()  # under the lock: two first boxes at once write the range once
        if prefer is not None and _take(prefer, session):
            return prefer
        start = random.randrange(SLOTS)
        for offset in range(SLOTS):
            ids = IdRange((start + offset) % SLOTS)
            if _take(ids, session):
                return ids
    raise IdRangeError(errno.ENOSPC, f"all {SLOTS} boxes' id ranges are in use: remove boxes (quinebox gc) and try again")


def usable() -> None:
    """Refused in one line where this root cannot map our range: it is itself in a user namespace that maps no id
    from BASE (LXC, a user-namespaced pod), or user namespaces are switched off."""
    try:
        with open("/proc/self/uid_map") as f:
            maps = [tuple(int(n) for n in line.split()) for line in f if line.strip()]
        with open("/proc/sys/user/max_user_namespaces") as f:
            allowed = int(f.read().strip() or 0)
    except (OSError, ValueError):
        return
    end = BASE + SLOTS * SPAN
    if not any(inside <= BASE and end <= inside + count for inside, _, count in maps):
        raise IdRangeError(
            errno.ERANGE,
            f"this root's own user namespace does not map quinebox's box ids {BASE}…{end - 1} (/proc/self/uid_map): "
            "run quinebox where root maps them, or with --runtime runsc",
        )
    if allowed == 0:
        raise IdRangeError(errno.EPERM, "user namespaces are switched off (user.max_user_namespaces = 0): sudo sysctl -w user.max_user_namespaces=15000, or --runtime runsc")


def _take(ids: IdRange, session: str) -> bool:
    try:
        ids.dir.mkdir(mode=0o711)
    except FileExistsError:
        if not stale(ids):
            return False
        _remove(ids)
        try:
            ids.dir.mkdir(mode=0o711)
        except OSError:
            return False  # something of a box's is still in it: never shared
    except OSError:
        return False
    os.chmod(ids.dir, 0o711)
    _write_claim(ids, session, os.getpid())
    return True


def _claim_file(ids: IdRange, session: str) -> Path:
    return ids.dir / f"{CLAIM}.{session}"


def _write_claim(ids: IdRange, session: str, pid: int) -> None:
    fd = os.open(_claim_file(ids, session), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{pid} {process_start_ticks(pid)}\n")


def join(ids: IdRange, session: str) -> None:
    """The box of `session` (a child) holds its parent's slot too, until it is released: the slot is never
    freed while any box in it lives, its parent gone first or not."""
    with _locked():
        _write_claim(ids, session, os.getpid())


def settle(ids: IdRange, session: str, pid: int) -> None:
    """The box's init (`pid`) holds its claim on the slot from now on: it outlives its maker when the keeper has it."""
    with _locked():
        if _claim_file(ids, session).exists():
            _write_claim(ids, session, pid)


def claimants(ids: IdRange) -> list[str]:
    """The sessions whose boxes hold the slot."""
    return [name.removeprefix(f"{CLAIM}.") for name in entries(ids.dir) if name.startswith(f"{CLAIM}.")]


def stale(ids: IdRange) -> bool:
    """Whether a slot is held by nothing alive: every claim's process gone, and nothing mounted in it."""
    for session in claimants(ids):
        try:
            fields = _claim_file(ids, session).read_text().split()
        except OSError:
            continue
        if len(fields) == 2 and fields[0].isdigit() and pid_alive(int(fields[0]), fields[1]):
            return False
    return not any(os.path.ismount(path) for path in _points(ids))


def _points(ids: IdRange) -> list[str]:
    """Every directory in a slot and one level below: the boxes' roots and the host's mounts beside them."""
    found = []
    for top in entries(ids.dir):
        path = os.path.join(ids.dir, top)
        if os.path.isdir(path) and not os.path.islink(path):
            found.append(path)
            found += [os.path.join(path, name) for name in entries(path) if os.path.isdir(os.path.join(path, name))]
    return found


def entries(path: Path | str) -> list[str]:
    """The names in a directory, none where it is not one (or is gone)."""
    try:
        return os.listdir(path)
    except OSError:
        return []


def release(ids: IdRange, session: str) -> None:
    """What the box of `session` had in the slot removed (its claim, its root's and its mounts' empty
    directories), and the slot freed once no box holds it. Never raises: a box's removal goes on whatever is left
    here (a mount still there keeps the slot taken, until gc)."""
    if not ids.dir.is_dir():
        return
    try:
        with _locked():
            _remove_dirs(ids.root_for(session))
            try:
                _claim_file(ids, session).unlink()
            except FileNotFoundError:
                pass
            if not claimants(ids):
                _remove(ids)
    except OSError:
        pass


def _remove_dirs(root: Path) -> None:
    """A box's empty directories in its slot: its root's and its mounts' (`.mnt/N`); a mounted one stays."""
    mounts = Path(f"{root}.mnt")
    for path in [*(mounts / name for name in entries(mounts)), mounts, root]:
        try:
            os.rmdir(path)
        except OSError:
            pass


def _remove(ids: IdRange) -> bool:
    """The slot's directory and what is in it removed, when nothing of a box's is left mounted there: whether it went."""
    for name in entries(ids.dir):
        if not name.startswith(f"{CLAIM}."):
            _remove_dirs(ids.dir / name.removesuffix(".mnt"))
    if any(not name.startswith(f"{CLAIM}.") for name in entries(ids.dir)):
        return False  # a root or mount still there (mounted): the slot stays taken
    for name in entries(ids.dir):
        try:
            os.unlink(ids.dir / name)
        except OSError:
            pass
    try:
        ids.dir.rmdir()
    except OSError:
        return False
    return True


def sweep() -> int:
    """Free every stale slot (gc): how many."""
    if not BOXES.is_dir() or os.geteuid() != 0:
        return 0
    freed = 0
    with _locked():
        for name in os.listdir(BOXES):
            if name.isdigit() and int(name) < SLOTS and stale(IdRange(int(name))):
                freed += _remove(IdRange(int(name)))
    return freed


#: The ids of each box this process runs on a runtime, by its session: its children's are the same (`inherited`).
_by_session: dict[str, IdRange] = {}


def note(session: str, ids: IdRange | None) -> None:
    """The box of `session`, run by this process, has `ids` (None: it has ended, or has none)."""
    if ids is None:
        _by_session.pop(session, None)
    else:
        _by_session[session] = ids


def inherited(parent: str | None) -> IdRange | None:
    """The ids a child of the box `parent` shares, when this process runs that box on a runtime with ids of its own."""
    return _by_session.get(parent) if parent else None


class _locked:
    """Every claim, release and sweep of the machine's slots, one at a time (a lock file's flock)."""

    def __enter__(self) -> None:
        self._fd = os.open(RUN / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *_: object) -> None:
        os.close(self._fd)

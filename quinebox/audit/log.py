"""The audit log: one append-only, hash-chained record of every authority decision in a state dir.

    audit/log.jsonl   one record per line: seq, time, session, kind, facts, prev, hash[, mac]
    audit/segments/   FIRST-LAST.jsonl: the log's earlier records, sealed (read-only, 0400) once it grew past
                      QUINEBOX_AUDIT_SEGMENT bytes (64 MiB); the chain runs on through them unbroken
    audit/head.json   the chain's head (seq and hash[, mac]) as of the last append, padded to HEAD_SIZE

Each record's `hash` is SHA-256 over the canonical JSON of the record without
its hash and mac, and `prev` is the hash of the record before it, so an edit,
deletion, insertion or reordering breaks the chain at the first record
touched. Truncating the tail leaves a valid chain, which is why the head is
checkpointed apart from the log: a log that ends before its head was cut.
Anyone who can write the state dir can still rewrite the whole chain and its
head; with a key (QUINEBOX_AUDIT_KEY_FILE, kept outside the state dir) every
record and the head also carry an HMAC, and a rewrite without the key is
found at the first record it changed.

Writers serialize on an flock of the log, so any number of quinebox
processes append at once without interleaving. The writer whose record takes
the log past its segment size seals it: renames it into segments/ under that
lock and leaves an empty log in its place, whose first record chains to the
segment's last. Everyone who takes the lock checks that the file they hold
is still the log (else takes the new one), and `verify` walks the segments
in order, then the log, as one chain. The seal makes a segment read-only
only once it is no longer the log: a writer opening the log by its name
meanwhile (for writing, before it waits for the lock) must find either the
old file still writable or the new one, never a read-only file by the log's
name, which a plain user (unlike root) is refused. What is here is the
user's alone whatever the umask: dirs 0700, the log and head 0600 (state.py). No record is ever edited or removed:
`quinebox prune` leaves the records of the sessions it prunes, and adds its own. A writer killed mid-line
leaves a torn last line; `verify` says so (it is not tampering: the head
was never moved past it), and the next writer cuts it off and records that
it did.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from quinebox.documents import json_objects
from quinebox.errors import ErrorKind, QuineboxError, StateError
from quinebox.state import SEALED_MODE, private_dir, private_file, state_dir, unwritable

GENESIS = "0" * 64
#: Longest string kept in a record's facts; a box's words are evidence, not an unbounded disk write.
MAX_TEXT = 4096
#: The head file's fixed size: a head (with its mac) padded with spaces, so each checkpoint overwrites all of the last.
HEAD_SIZE = 256
_TAIL_READ = 8192


def canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _digest(body: dict[str, Any]) -> str:
    return hashlib.sha256(canonical(body)).hexdigest()


def _mac(key: bytes, text: str) -> str:
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def _bounded(value: Any) -> Any:
    if isinstance(value, str):
        return value if len(value) <= MAX_TEXT else value[:MAX_TEXT] + f"…[{len(value)} chars]"
    if isinstance(value, dict):
        return {str(k): _bounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_bounded(v) for v in value]
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return _bounded(str(value))


def audit_dir() -> Path:
    return state_dir() / "audit"


def audit_key() -> bytes | None:
    """The HMAC key named by QUINEBOX_AUDIT_KEY_FILE; refused inside the state dir, where it would guard nothing."""
    path = os.environ.get("QUINEBOX_AUDIT_KEY_FILE")
    if not path:
        return None
    real = os.path.realpath(path)
    home = os.path.realpath(state_dir())
    if real == home or real.startswith(home + "/"):
        raise QuineboxError(
            f"QUINEBOX_AUDIT_KEY_FILE {path} is inside the state dir, where whoever edits the log can read it; keep the key elsewhere",
            kind=ErrorKind.REFUSED, path=path,
        )
    try:
        key = Path(real).read_bytes().strip()
    except OSError as exc:
        raise QuineboxError(f"cannot read the audit key QUINEBOX_AUDIT_KEY_FILE={path}: {exc.strerror}",
                            kind=ErrorKind.NOT_FOUND if isinstance(exc, FileNotFoundError) else ErrorKind.FAILED, path=path) from exc
    if len(key) < 16:
        raise QuineboxError(f"the audit key in {path} is shorter than 16 bytes; make one with `head -c 32 /dev/urandom | base64 > {path}`", kind=ErrorKind.BAD_INPUT, path=path)
    return key


class AuditLog:
    """The log of one state dir, appended under an flock so that many processes share it."""

    def __init__(self, directory: Path | None = None, key: bytes | None = None):
        self.directory = directory or audit_dir()
        self.path = self.directory / "log.jsonl"
        self.head_path = self.directory / "head.json"
        self.key = key

    @property
    def segments(self) -> Path:
        return self.directory / "segments"

    def append(self, kind: str, session: str | None = None, /, **facts: Any) -> dict[str, Any]:
        """Add one record, chained to the last; StateError when the state dir cannot take it."""
        try:
            fd = self._locked(fcntl.LOCK_EX)
        except OSError as exc:
            raise StateError(unwritable("the audit log", exc), what="the audit log") from exc
        try:
            last, torn = _tail(fd)
            if last is None:  # a log just sealed (its only line, if any, torn): the chain goes on from its segment's last record
                last = self._sealed_head()
            if torn:
                os.ftruncate(fd, os.fstat(fd).st_size - torn)
                last = self._write(fd, last, "audit_repaired", None, {"torn_bytes": torn, "why": "a writer was stopped mid-record"})
            record = self._write(fd, last, kind, session, facts)
            self._checkpoint(record)
            if os.fstat(fd).st_size >= segment_bytes():
                self._seal(fd, record)
            return record
        except OSError as exc:
            raise StateError(unwritable("the audit log", exc), what="the audit log") from exc
        finally:
            os.close(fd)  # releases the lock

    def _locked(self, how: int, *, create: bool = True) -> int:
        """The log's fd holding `how`, once the file locked is still the log (a writer may have sealed it meanwhile)."""
        flags = os.O_RDWR | os.O_APPEND | (os.O_CREAT if create else 0)
        while True:
            try:
                fd = private_file(self.path, flags)
            except FileNotFoundError:
                if not create:
                    raise
                private_dir(self.directory)
                continue
            fcntl.flock(fd, how)
            try:
                if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                    return fd
            except FileNotFoundError:
                pass
            os.close(fd)

    def _sealed(self) -> list[Path]:
        """The sealed segments, oldest first."""
        try:
            return sorted(p for p in self.segments.iterdir() if p.suffix == ".jsonl")
        except FileNotFoundError:
            return []

    def _sealed_head(self) -> dict[str, Any] | None:
        sealed = self._sealed()
        if not sealed:
            return None
        fd = os.open(sealed[-1], os.O_RDONLY | os.O_CLOEXEC)
        try:
            return _tail(fd)[0]
        finally:
            os.close(fd)

    def _seal(self, fd: int, last: dict[str, Any]) -> None:
        """Under the lock: the log becomes segments/FIRST-LAST.jsonl, read-only, and an empty log takes its place.

        Renamed first, made read-only after: a writer that opens the log meanwhile (it opens, then waits for the lock)
        opens this file while it is still writable, then finds it is no longer the log and takes the new one; made
        read-only first, the open by the log's name is refused (EACCES) to anyone but root, and that writer's record
        is lost."""
        first = json.loads(os.pread(fd, _first_line_end(fd), 0))["seq"]
        private_dir(self.segments)
        os.rename(self.path, self.segments / f"{first:012d}-{last['seq']:012d}.jsonl")
        os.fchmod(fd, SEALED_MODE)
        try:
            os.close(private_file(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            pass  # a writer that found none made it already

    def _write(self, fd: int, last: dict[str, Any] | None, kind: str, session: str | None, facts: dict[str, Any]) -> dict[str, Any]:
        body = {
            "seq": int(last.get("seq", -1)) + 1 if last else 0,
            "time": datetime.now(UTC).isoformat(timespec="microseconds"),
            "session": session,
            "kind": kind,
            "facts": _bounded(facts),
            "prev": str(last.get("hash", GENESIS)) if last else GENESIS,
        }
        record = {**body, "hash": _digest(body)}
        if self.key is not None:
            record["mac"] = _mac(self.key, record["hash"])
        line = canonical(record) + b"\n"
        written = os.write(fd, line)
        if written != len(line):  # a short write on a full disk: cut it off, so the log stays whole
            os.ftruncate(fd, os.fstat(fd).st_size - written)
            raise OSError(28, "No space left on device")
        return record

    def _checkpoint(self, record: dict[str, Any]) -> None:
        """The head, overwritten in place at a fixed size under the log's lock: one small write, no rename (a rename costs
        a third of a millisecond here, and every box pays for two records)."""
        head = {"seq": record["seq"], "hash": record["hash"]}
        if self.key is not None:
            head["mac"] = _mac(self.key, f"{record['seq']}:{record['hash']}")
        fd = private_file(self.head_path, os.O_WRONLY | os.O_CREAT)
        try:
            os.pwrite(fd, canonical(head).ljust(HEAD_SIZE), 0)
        finally:
            os.close(fd)

    def records(self) -> Iterator[dict[str, Any]]:
        """Every complete record that parses, in order, the sealed segments' first (a torn tail is left out)."""
        for path in [*self._sealed(), self.path]:
            try:
                handle = path.open("rb")
            except FileNotFoundError:
                continue
            with handle:
                yield from json_objects(line for line in handle if line.endswith(b"\n"))


def segment_bytes() -> int:
    """The size past which the log is sealed into a segment (read when used: a command server's worker has its client's environment)."""
    return int(os.environ.get("QUINEBOX_AUDIT_SEGMENT", str(64 << 20)))


def _first_line_end(fd: int) -> int:
    """How many bytes the first line of `fd`'s file holds, its newline included."""
    window = 4096
    while True:
        data = os.pread(fd, window, 0)
        end = data.find(b"\n")
        if end >= 0:
            return end + 1
        if len(data) < window:
            return len(data)
        window *= 4


def _tail(fd: int) -> tuple[dict[str, Any] | None, int]:
    """(the last complete record, or None; how many bytes of a torn last line follow it)."""
    size = os.fstat(fd).st_size
    window = min(size, _TAIL_READ)
    while window:
        data = os.pread(fd, window, size - window)
        torn = len(data) - (data.rfind(b"\n") + 1)
        body = data[: len(data) - torn]
        cut = body.rfind(b"\n", 0, len(body) - 1)
        if cut >= 0 or window == size:
            line = body[cut + 1 :]
            if not line:
                return None, torn
            try:
                record = json.loads(line)
            except ValueError:
                record = {"hash": hashlib.sha256(line).hexdigest()}  # a bad line still chains: verify names it
            return (record if isinstance(record, dict) else {}), torn
        window = min(size, window * 4)
    return None, 0


@dataclass(frozen=True)
class Verdict:
    """What `verify` found. `bad` is the sequence number of the first record that is not what was written."""

    records: int
    bad: int | None = None
    why: str = ""
    torn: bool = False

    @property
    def intact(self) -> bool:
        return self.bad is None

    def line(self) -> str:
        if self.bad is not None:
            return f"record {self.bad}: {self.why}"
        torn = "; its last line is torn (a writer was stopped mid-record, not an edit): the next write repairs it" if self.torn else ""
        return f"intact: {self.records} record(s){torn}"


def verify(log: AuditLog | None = None) -> Verdict:
    """Walk the chain from the start; the first record that breaks it, or that the head says is missing."""
    log = log or AuditLog(key=audit_key())
    try:
        fd = log._locked(fcntl.LOCK_SH, create=False)  # the log and its head as one writer left them, not halfway through another
    except FileNotFoundError:
        fd = -1
    try:
        sealed = b"".join(path.read_bytes() for path in log._sealed())
        data = sealed + (_read_all(fd) if fd >= 0 else b"")
        head = _read_head(log)
    finally:
        if fd >= 0:
            os.close(fd)
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the log ends with a newline
    previous = GENESIS
    for seq, line in enumerate(lines):
        why = _check(line, seq, previous, log.key)
        if why:
            return Verdict(seq, bad=seq, why=why)
        previous = json.loads(line)["hash"]
    count = len(lines)
    if isinstance(head, str):
        return Verdict(count, bad=count, why=head)
    if head is not None:
        seq, digest = head["seq"], head["hash"]
        if log.key is not None and not hmac.compare_digest(str(head.get("mac", "")), _mac(log.key, f"{seq}:{digest}")):
            return Verdict(count, bad=min(seq, count), why="the checkpointed head's HMAC does not match: the head was rewritten without the key")
        if seq >= count:
            return Verdict(count, bad=count, why=f"missing: the log ends after {count} record(s) but its checkpointed head is record {seq}; the tail was cut off")
        if json.loads(lines[seq])["hash"] != digest:
            return Verdict(count, bad=seq, why="its hash differs from the checkpointed head's: the chain was rewritten from here or before")
    return Verdict(count, torn=bool(tail))


def _read_all(fd: int) -> bytes:
    chunks, offset = [], 0
    while chunk := os.pread(fd, 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _check(line: bytes, seq: int, previous: str, key: bytes | None) -> str:
    try:
        record = json.loads(line)
    except ValueError:
        return "not a record (it does not parse as JSON)"
    if not isinstance(record, dict) or not isinstance(record.get("hash"), str):
        return "not a record (no hash)"
    if record.get("seq") != seq:
        return f"out of place: it says it is record {record.get('seq')!r}; a record was removed, added or moved here"
    if record.get("prev") != previous:
        return "its link to the record before does not match: a record before it was changed, removed or moved"
    body = {k: v for k, v in record.items() if k not in ("hash", "mac")}
    if _digest(body) != record["hash"]:
        return "its contents do not match its hash: it was edited"
    if key is not None and not hmac.compare_digest(str(record.get("mac", "")), _mac(key, record["hash"])):
        return "its HMAC does not match: it was rewritten without the key"
    return ""


def _read_head(log: AuditLog) -> dict[str, Any] | str | None:
    try:
        head = json.loads(log.head_path.read_bytes())
    except FileNotFoundError:
        return None
    except ValueError:
        return "the checkpointed head does not parse: it was edited"
    if not isinstance(head, dict) or not isinstance(head.get("seq"), int) or not isinstance(head.get("hash"), str):
        return "the checkpointed head is not a head: it was edited"
    return head


_LOGS: dict[tuple[Path, bytes | None], AuditLog] = {}
_LOSING = threading.Event()


def record(kind: str, session: str | None = None, /, **facts: Any) -> None:
    """Append to this state dir's log before acting (unless QUINEBOX_AUDIT=off, for measuring what the log costs):
    StateError when it cannot be written, so that what cannot be recorded does not happen."""
    if os.environ.get("QUINEBOX_AUDIT") == "off":
        return
    key = audit_key()
    where = (audit_dir(), key)
    log = _LOGS.get(where)
    if log is None:
        log = _LOGS[where] = AuditLog(where[0], key)
    log.append(kind, session, **facts)


def note(kind: str, session: str | None = None, /, **facts: Any) -> None:
    """Append what already happened (a box ended, a connection closed): a full state dir cannot undo it, so it is
    said once on stderr instead of failing whoever was only reporting."""
    try:
        record(kind, session, **facts)
    except QuineboxError as exc:
        if not _LOSING.is_set():
            _LOSING.set()
            print(f"quinebox: {exc}; audit records are being lost", file=sys.stderr, flush=True)

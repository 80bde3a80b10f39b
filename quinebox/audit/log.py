"""The audit log: one append-only, hash-chained record of every authority decision in a state dir.

    audit/log.jsonl   one record per line: seq, time, session, kind, facts, prev, hash[, mac]
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
processes append at once without interleaving. A writer killed mid-line
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
from quinebox.errors import QuineboxError, StateError
from quinebox.state import state_dir, unwritable

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
        raise QuineboxError(f"QUINEBOX_AUDIT_KEY_FILE {path} is inside the state dir, where whoever edits the log can read it; keep the key elsewhere")
    try:
        key = Path(real).read_bytes().strip()
    except OSError as exc:
        raise QuineboxError(f"cannot read the audit key QUINEBOX_AUDIT_KEY_FILE={path}: {exc.strerror}") from None
    if len(key) < 16:
        raise QuineboxError(f"the audit key in {path} is shorter than 16 bytes; make one with `head -c 32 /dev/urandom | base64 > {path}`")
    return key


class AuditLog:
    """The log of one state dir, appended under an flock so that many processes share it."""

    def __init__(self, directory: Path | None = None, key: bytes | None = None):
        self.directory = directory or audit_dir()
        self.path = self.directory / "log.jsonl"
        self.head_path = self.directory / "head.json"
        self.key = key

    def append(self, kind: str, session: str | None = None, /, **facts: Any) -> dict[str, Any]:
        """Add one record, chained to the last; StateError when the state dir cannot take it."""
        try:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except FileNotFoundError:
                self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
                fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise StateError(unwritable("the audit log", exc)) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            last, torn = _tail(fd)
            if torn:
                os.ftruncate(fd, os.fstat(fd).st_size - torn)
                last = self._write(fd, last, "audit_repaired", None, {"torn_bytes": torn, "why": "a writer was stopped mid-record"})
            record = self._write(fd, last, kind, session, facts)
            self._checkpoint(record)
            return record
        except OSError as exc:
            raise StateError(unwritable("the audit log", exc)) from None
        finally:
            os.close(fd)  # releases the lock

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
        fd = os.open(self.head_path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.pwrite(fd, canonical(head).ljust(HEAD_SIZE), 0)
        finally:
            os.close(fd)

    def records(self) -> Iterator[dict[str, Any]]:
        """Every complete record that parses, in order (a torn tail is left out)."""
        try:
            handle = self.path.open("rb")
        except FileNotFoundError:
            return
        with handle:
            yield from json_objects(line for line in handle if line.endswith(b"\n"))


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
        with log.path.open("rb") as handle:
            fcntl.flock(handle, fcntl.LOCK_SH)  # the log and its head as one writer left them, not halfway through another
            data = handle.read()
            head = _read_head(log)
    except FileNotFoundError:
        data, head = b"", _read_head(log)
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

"""The records of a tape, one typed schema per kind, and the one reader every reader of a tape goes through.

The tape is the host's. It writes most kinds itself (the model's words among them: `request`, `response`);
a box adds only the five kinds its agent reports (`tool`, `tool_error`, `exec`, `exit`, `terminated`), and only
after `box_record` has checked each against its schema and its caps, so that nothing a box sends can stand in
for a record of the host's. Whatever is on disk, `read_records` yields only records that fit their kind's schema
and counts the lines it passed over (torn, junk, of an unknown kind, or of a known kind with the wrong fields):
no reader of a tape has to guard an index of its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec

#: Most bytes one record of a box's may take (the guest's own are a few tens of KiB: its output cap is 16 KiB).
MAX_BOX_RECORD = 1 << 20
#: Most bytes a box may add to its tape in all; past that its events are refused (the host's records go on).
BOX_SHARE = 64 << 20
#: Refused events recorded per session (`box_refused`); the rest are only counted there, never written.
MAX_REFUSALS = 32


class Record(msgspec.Struct, kw_only=True, tag_field="kind", omit_defaults=True):
    """Every record has the host's time and its kind."""

    t: float


# -- records of the host's ---------------------------------------------------------


class ForkedFrom(msgspec.Struct):
    session: str
    turn: int
    revision: int


class Meta(Record, tag="meta"):
    """How the session was started: what `fork` and `resume` start it again with (a tape from before a field was
    written holds its default)."""

    session: str
    mission: str
    model: str
    parent: str | None = None
    grants: list[str] = []
    image: str | None = None
    workdir: str | None = None
    depth: int = 0
    forked_from: ForkedFrom | None = None
    #: The tree's token budget (`--max-tokens` or tokens:N), and the turns and exec cycles each conversation may take.
    tokens: int | None = None
    max_turns: int | None = None
    max_cycles: int | None = None
    #: The tree's ask and deny rules and how long a request waits for a person, as `Asks` holds them.
    ask: list[str] = []
    deny: list[str] = []
    ask_timeout: float | None = None
    #: The backend and OCI runtime its policy required, if it did (else the environment's choice, as for any box).
    backend: str | None = None
    runtime: str | None = None


class Request(Record, tag="request"):
    """What the agent asked the model at `turn`: the messages new since its last request, and how many bytes of its
    material (its stdin) its tools had read by then, as its box counted them (None: the box did not say)."""

    turn: int
    cycle: int
    digest: str
    messages: list[dict[str, Any]]
    material: int | None = None


class Function(msgspec.Struct):
    name: str
    arguments: str


class ToolCall(msgspec.Struct):
    id: str | None  # some OpenAI-compatible servers send null; the key is written back as it came
    type: str
    function: Function


class Message(msgspec.Struct, omit_defaults=True):
    """As the providers write it (role and content always, tool_calls when there are some): read back byte for
    byte, so that a replayed conversation has the digest of the recorded one."""

    role: str
    content: str | None
    tool_calls: list[ToolCall] | None = None


class Response(Record, tag="response"):
    """The model's answer at `turn`: only the host writes one."""

    turn: int
    message: Message
    usage: dict[str, int | None] = {}
    finish_reason: str | None = None
    latency_s: float = 0.0


class ProviderFailure(Record, tag="provider_error"):
    turn: int
    termination: str
    message: str


class Cycle(Record, tag="cycle"):
    """A new conversation began (the agent's exec): the host's record of it, beside the box's `exec`."""

    cycle: int


class Revision(Record, tag="revision"):
    rev: int
    files: int
    bytes: int
    turn: int | None = None
    what: str = "sh"
    command: str | None = None


class WorldError(Record, tag="world_error"):
    message: str
    turn: int | None = None


class RestoreWorld(Record, tag="restore_world"):
    revision: int
    before: int | None = None
    undone: list[str] = []


class Adopt(Record, tag="adopt"):
    adopted: list[str] = []


class Egress(Record, tag="egress"):
    allowed: bool
    host: str | None = None
    port: int | None = None
    address: str | None = None
    rule: str | None = None
    why: str | None = None
    exfiltration: str | None = None
    up: int = 0
    down: int = 0
    secrets: list[str] = []


class Spawn(Record, tag="spawn"):
    child: str
    what: str
    grants: list[str] = []
    detached: bool = False


class EscalationRefused(Record, tag="escalation_refused"):
    request: dict[str, Any]
    reason: str


class Entered(Record, tag="entered"):
    argv: list[str]
    uid: int
    exit_code: int


class BoxRefused(Record, tag="box_refused"):
    """An event the box sent that is none of the box's to add (its name cut to 64 characters), and why."""

    event: str
    why: str


class Resumed(Record, tag="resumed"):
    """The session went on after the process running it was lost (`quinebox resume`): from its request at `turn`
    (in conversation `cycle`), with its world as it was then (`revision`, None for a world that keeps none), the
    first `material` bytes of its stdin passed over, run by `owner` (`host:pid:start`). `answered`: the model's
    recorded answer at `turn` is taken again and its tool calls run again; else the model is asked again."""

    turn: int
    cycle: int
    material: int
    owner: str
    answered: bool
    revision: int | None = None


class Outcome(Record, tag="outcome"):
    exit_code: int
    termination: str
    duration_s: float
    tokens: int
    turns: int


# -- records of the box's: what its agent reports of its tools -------------------------


class Tool(Record, tag="tool"):
    turn: int
    name: str
    args: dict[str, Any]
    exit_code: int
    result: str


class ToolFailure(Record, tag="tool_error"):
    turn: int
    name: str
    error: str


class Exec(Record, tag="exec"):
    """The agent's exec call, as its box reports it (the host's own record of the new conversation is `cycle`)."""

    turn: int
    cycle: int
    note: str = ""


class Exit(Record, tag="exit"):
    turn: int
    status: Literal["success", "failure"]
    reason: str = ""


class Terminated(Record, tag="terminated"):
    turn: int
    termination: Literal["turn_exhaustion"]


#: The kinds a box may add, by the event name its guest sends (guest/agent.py): no other name becomes a record.
BOX_KINDS: dict[str, type[Record]] = {"tool": Tool, "tool_error": ToolFailure, "exec": Exec, "exit": Exit, "terminated": Terminated}

AnyRecord = (
    Meta | Request | Response | ProviderFailure | Cycle | Revision | WorldError | RestoreWorld | Adopt | Egress | Spawn
    | EscalationRefused | Entered | BoxRefused | Resumed | Outcome | Tool | ToolFailure | Exec | Exit | Terminated
)
_decoder = msgspec.json.Decoder(AnyRecord)


def parse(line: bytes) -> AnyRecord | None:
    """One tape line as its record, or None when it is not one (torn, junk, unknown kind, wrong fields)."""
    try:
        return _decoder.decode(line)
    except (msgspec.DecodeError, RecursionError):  # ValidationError is a DecodeError
        return None


def as_dict(record: msgspec.Struct) -> dict[str, Any]:
    """A record (or a message in one) as the JSON object it was written as (fields at their defaults left out), for readers that show it."""
    return msgspec.to_builtins(record)


@dataclass
class Records:
    """A tape's records in order, and how many lines were passed over."""

    records: list[AnyRecord] = field(default_factory=list)
    skipped: int = 0

    def __iter__(self) -> Iterator[AnyRecord]:
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)

    def of(self, kind: type[Record]) -> list[Any]:
        return [r for r in self.records if isinstance(r, kind)]

    def meta(self) -> Meta | None:
        return self.records[0] if self.records and isinstance(self.records[0], Meta) else None

    def outcome(self) -> Outcome | None:
        return next((r for r in reversed(self.records) if isinstance(r, Outcome)), None)


def read_lines(lines: Iterable[bytes]) -> Records:
    out = Records()
    for line in lines:
        if not line.strip():
            continue
        record = parse(line)
        if record is None:
            out.skipped += 1
        else:
            out.records.append(record)
    return out


def read_file(path: Path) -> Records:
    """A tape file's records; a last line without its newline is still being written, and is not read yet."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return Records()
    return read_lines(data.split(b"\n")[:-1])


# -- what a box may write ----------------------------------------------------------------


class Refusal(Exception):
    """A box's event that becomes no record of its kind; the message says why (one line)."""


def box_record(event: dict[str, Any], t: float) -> Record:
    """The record a box's event frame becomes: its kind chosen by the host from BOX_KINDS, its fields checked.

    Raises Refusal for an event name that is none of the box's, fields that do not fit, or a record over
    MAX_BOX_RECORD. Fields the kind does not have are dropped; the time is the host's."""
    name = event.get("event")
    kind = BOX_KINDS.get(name) if isinstance(name, str) else None
    if kind is None:
        raise Refusal(f"{str(name)[:64]!r} is not an event a box may record (only {', '.join(BOX_KINDS)})")
    fields = {k: v for k, v in event.items() if k not in ("kind", "event", "t")}
    try:
        record = msgspec.convert({**fields, "t": t}, kind)
    except msgspec.ValidationError as exc:
        raise Refusal(f"a {name} event that does not fit its schema: {str(exc)[:200]}") from None
    if len(msgspec.json.encode(record)) > MAX_BOX_RECORD:
        raise Refusal(f"a {name} event over {MAX_BOX_RECORD >> 10} KiB")
    return record

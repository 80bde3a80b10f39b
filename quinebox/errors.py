"""Errors that quinebox reports as one line and an exit code, never a traceback: data, not prose.

Each `QuineboxError` has a `kind` (an `ErrorKind`: what went wrong, for a caller to decide on) and `fields`
(the facts it is about: a box's id, an image's name, a limit), given as keyword arguments where it is raised:

    raise ImageError(f"image {name} is not here: ...", kind=ErrorKind.NOT_FOUND, image=name)

Its message is for a person; code decides by `kind`, by type and by fields, never by the message's words.
A subclass has a kind of its own by default (a GrantError is a bad grant, an EngineError an engine that cannot be
reached), which the raise site overrides where it knows better. The cause stays on the exception as Python keeps it
(`__cause__`, or `__context__` under `raise ... from None`): `cause` is whichever there is, and `quinebox
--traceback` (or QUINEBOX_TRACEBACK=1) prints the whole chain.
"""

from __future__ import annotations

import enum
import errno
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar

#: quinebox itself failed before or while starting the box; nothing was started.
EXIT_QUINEBOX = 125


class ErrorKind(enum.StrEnum):
    """What kind of failure an error is: the one thing a caller decides on (its value is what JSON carries)."""

    #: quinebox could not do it, and no kind below says more (a build that failed, a tool in the box that failed).
    FAILED = "failed"
    #: What was named is not there: a box, a session, an image, a snapshot, a revision.
    NOT_FOUND = "not_found"
    #: Something quinebox needs does not answer: the container engine, an OCI runtime, a box's owner, a cluster.
    UNREACHABLE = "unreachable"
    #: A policy said no: a deny rule, a person who did not approve, another user's box, what is never granted.
    REFUSED = "refused"
    #: A grant (or an ask/deny rule) that is malformed or unknown.
    BAD_GRANT = "bad_grant"
    #: Any other input that is malformed or does not fit: an option, a config file, a request, a name.
    BAD_INPUT = "bad_input"
    #: A limit is reached: a size, a count, a budget.
    LIMIT = "limit"
    #: A deadline passed before an answer came.
    TIMEOUT = "timeout"
    #: The state of things forbids it now: it exists already, is busy, paused, running, or was changed since.
    CONFLICT = "conflict"
    #: This backend, runtime, image or box cannot do it at all (a capability it lacks).
    UNSUPPORTED = "unsupported"
    #: What quinebox reads is not what it wrote, or not what it must be: a tampered manifest, a damaged archive,
    #: a malformed answer from a box.
    CORRUPT = "corrupt"
    #: quinebox's own state cannot be written (a full or read-only filesystem) or is not safe to use.
    STORAGE = "storage"


class QuineboxError(Exception):
    """A failure of quinebox itself (not of the boxed command): a message for a person, a kind and fields for code.

    `QuineboxError("message")` keeps working: its kind is the class's `default_kind`."""

    exit_code = EXIT_QUINEBOX
    #: The kind of an error of this class whose raise site does not say one.
    default_kind: ClassVar[ErrorKind] = ErrorKind.FAILED

    kind: ErrorKind
    fields: Mapping[str, Any]

    def __init__(self, *args: object, kind: ErrorKind | None = None, **fields: Any):
        super().__init__(*args)
        self.kind = ErrorKind(kind) if kind is not None else type(self).default_kind
        clashes = sorted(name for name in fields if hasattr(type(self), name) or name in ("args", "kind", "fields"))
        if clashes:  # a field named `exit_code` or `args` would change what the error is, not say a fact about it
            raise TypeError(f"{type(self).__name__}: a field may not be named {', '.join(clashes)}")
        self.fields = MappingProxyType(dict(fields))
        self.__dict__.update(fields)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled whole (a cluster's node sends errors back): the message, the kind and the fields."""
        return (_rebuild, (type(self), self.args, self.kind, dict(self.fields)), {k: v for k, v in self.__dict__.items() if k not in ("kind", "fields", *self.fields)})

    @property
    def cause(self) -> BaseException | None:
        """What this error came from: its `__cause__`, or under `raise ... from None` the `__context__` it still holds."""
        return self.__cause__ or self.__context__

    def data(self) -> dict[str, Any]:
        """The error as JSON-ready data: {"kind", "message", "fields"} (fields as given; the raiser keeps them plain)."""
        return {"kind": self.kind.value, "message": str(self), "fields": dict(self.fields)}


def _rebuild(cls: type[QuineboxError], args: tuple[object, ...], kind: ErrorKind, fields: dict[str, Any]) -> QuineboxError:
    error = cls.__new__(cls, *args)
    QuineboxError.__init__(error, *args, kind=kind, **fields)
    return error


class GrantError(QuineboxError, ValueError):
    """A grant that is malformed, unknown, or would expose the host."""

    default_kind = ErrorKind.BAD_GRANT


class EngineError(QuineboxError):
    """The container engine (or an OCI runtime) is unreachable or refused a request."""

    default_kind = ErrorKind.UNREACHABLE


class ImageError(QuineboxError):
    """The agent image is missing or cannot be built."""

    default_kind = ErrorKind.FAILED


class StateError(QuineboxError):
    """The state dir cannot be written (a full or read-only filesystem); what was written before stays whole."""

    default_kind = ErrorKind.STORAGE


class FileTooLargeError(OSError):
    """A file in a box holds more bytes than the caller's cap (EFBIG): nothing past the cap was read.

    An OSError, as the other errors of a file read are (FileNotFoundError, IsADirectoryError, shutil's
    SpecialFileError for a FIFO, a socket or a device), so one `except OSError` covers a read that failed."""

    def __init__(self, path: str, size: int | None, cap: int, raise_it: str):
        got = f"{size} bytes" if size is not None else "more bytes (it grew while read)"
        super().__init__(errno.EFBIG, f"{path} in the box holds {got}, more than the cap of {cap}: {raise_it} to read more")
        self.size, self.cap = size, cap

"""Errors that quinebox reports as one line and an exit code, never a traceback."""

from __future__ import annotations

import errno

#: quinebox itself failed before or while starting the box; nothing was started.
EXIT_QUINEBOX = 125


class QuineboxError(Exception):
    """A failure of quinebox itself (not of the boxed command)."""

    exit_code = EXIT_QUINEBOX


class GrantError(QuineboxError, ValueError):
    """A grant that is malformed, unknown, or would expose the host."""


class EngineError(QuineboxError):
    """The container engine is unreachable or refused a request."""


class ImageError(QuineboxError):
    """The agent image is missing or cannot be built."""


class StateError(QuineboxError):
    """The state dir cannot be written (a full or read-only filesystem); what was written before stays whole."""


class FileTooLargeError(OSError):
    """A file in a box holds more bytes than the caller's cap (EFBIG): nothing past the cap was read.

    An OSError, as the other errors of a file read are (FileNotFoundError, IsADirectoryError, shutil's
    SpecialFileError for a FIFO, a socket or a device), so one `except OSError` covers a read that failed."""

    def __init__(self, path: str, size: int | None, cap: int, raise_it: str):
        got = f"{size} bytes" if size is not None else "more bytes (it grew while read)"
        super().__init__(errno.EFBIG, f"{path} in the box holds {got}, more than the cap of {cap}: {raise_it} to read more")
        self.size, self.cap = size, cap

"""Errors that quinebox reports as one line and an exit code, never a traceback."""

from __future__ import annotations

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

"""What every provider speaks: a `Completion` in the chat-completions shape, or a `ProviderError` with its exit code."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

EXIT_UNAVAILABLE = 75


@dataclass
class Completion:
    message: dict[str, Any]
    usage: dict[str, int] = field(default_factory=dict)
    finish_reason: str | None = None


class ProviderError(Exception):
    """The model cannot answer; `exit_code` and `termination` say how the agent ends."""

    exit_code = 1
    termination = "provider_error"


class Unavailable(ProviderError):
    exit_code = EXIT_UNAVAILABLE
    termination = "provider_unavailable"


class Rejected(ProviderError):
    """401/404 and the like: retrying will not help, the configuration must change."""

    exit_code = 125
    termination = "provider_rejected"


class ContextOverflow(ProviderError):
    termination = "context_overflow"


class Provider(Protocol):
    name: str

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion: ...

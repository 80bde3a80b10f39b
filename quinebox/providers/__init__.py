"""Where model answers come from: an OpenAI-compatible endpoint, a script, or a recorded tape.

Every provider answers `complete(messages, tools)` with a `Completion` in the
chat-completions shape, or raises a `ProviderError` that says which exit code
ends the agent. Providers run on the host only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Protocol

from quinebox.errors import QuineboxError

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


def load_config() -> dict[str, Any]:
    """~/.config/quinebox/config.yaml (model, base_url, max_retries); the environment wins over it."""
    path = os.path.join(os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config"), "quinebox", "config.yaml")
    if not os.path.exists(path):
        return {}
    from quinebox.documents import read_yaml

    doc = read_yaml(path, "config file") or {}
    if not isinstance(doc, dict):
        raise QuineboxError(f"{path} must be a YAML mapping (model:, base_url:, max_retries:)")
    return doc


def resolve_model(model: str | None) -> str:
    config = load_config()
    chosen = model or os.environ.get("QUINEBOX_MODEL") or config.get("model")
    if chosen:
        return str(chosen)
    if os.environ.get("OPENAI_API_KEY"):
        return "gpt-4o-mini"
    raise QuineboxError("no model configured: set OPENAI_API_KEY (and QUINEBOX_MODEL), or use --model script:FILE.yaml")


def provider_for(model: str) -> Provider:
    """`script:FILE.yaml`, `replay:SESSION`, or a model name at an OpenAI-compatible endpoint."""
    if model.startswith("script:"):
        from quinebox.providers.script import ScriptProvider

        return ScriptProvider(model[len("script:") :])
    if model.startswith("replay:"):
        from quinebox.providers.replay import ReplayProvider

        return ReplayProvider(model[len("replay:") :])
    from quinebox.providers.openai import OpenAIProvider

    config = load_config()
    return OpenAIProvider(
        model,
        api_key=os.environ.get("OPENAI_API_KEY") or config.get("api_key"),
        base_url=os.environ.get("OPENAI_BASE_URL") or config.get("base_url"),
        max_retries=int(os.environ.get("QUINEBOX_MAX_RETRIES") or config.get("max_retries") or 4),
    )

"""Where model answers come from: an OpenAI-compatible endpoint, a script, or a recorded tape.

Every provider answers `complete(messages, tools)` with a `Completion` in the chat-completions shape, or raises
a `ProviderError` that says which exit code ends the agent (base.py). The providers: any OpenAI-compatible
endpoint (openai.py), a scripted model's turns from a YAML file (script.py), and a recorded tape's answers in
order (replay.py); `provider_for` picks one by the model's name. Providers run on the host only.
"""

from __future__ import annotations

import os

from quinebox.agent.providers.base import EXIT_UNAVAILABLE, Completion, ContextOverflow, Provider, ProviderError, Rejected, Unavailable
from quinebox.documents import load_config
from quinebox.errors import QuineboxError

__all__ = [
    "EXIT_UNAVAILABLE", "Completion", "ContextOverflow", "Provider", "ProviderError", "Rejected", "Unavailable",
    "load_config", "provider_for", "resolve_model",
]


def resolve_model(model: str | None) -> str:
    config = load_config()
    chosen = model or os.environ.get("QUINEBOX_MODEL") or config.get("model")
    if chosen:
        return str(chosen)
    if os.environ.get("OPENAI_API_KEY"):
        return "gpt-4o-mini"
    raise QuineboxError("no model configured: set OPENAI_API_KEY (and QUINEBOX_MODEL), or use --model script:FILE.yaml")


def provider_for(model: str, *, answered: int = 0) -> Provider:
    """`script:FILE.yaml`, `replay:SESSION`, or a model name at an OpenAI-compatible endpoint.

    `answered`: the model calls a resumed session had answered already, which a script or a recording goes on after."""
    if model.startswith("script:"):
        from quinebox.agent.providers.script import ScriptProvider

        return ScriptProvider(model[len("script:") :], start=answered)
    if model.startswith("replay:"):
        from quinebox.agent.providers.replay import ReplayProvider

        return ReplayProvider(model[len("replay:") :], start=answered)
    from quinebox.agent.providers.openai import OpenAIProvider

    config = load_config()
    api_key = os.environ.get("OPENAI_API_KEY") or config.get("api_key")
    base_url = os.environ.get("OPENAI_BASE_URL") or config.get("base_url")
    if not api_key and not base_url:  # nothing would answer but OpenAI's own service, and it would refuse: ask before sending anything
        raise QuineboxError(
            f"no API key for model {model}: set OPENAI_API_KEY (or OPENAI_BASE_URL for a local endpoint); "
            "on a cluster, set it on each node or pass --forward-env OPENAI_API_KEY"
        )
    return OpenAIProvider(
        model,
        api_key=api_key,
        base_url=base_url,
        max_retries=int(os.environ.get("QUINEBOX_MAX_RETRIES") or config.get("max_retries") or 4),
    )

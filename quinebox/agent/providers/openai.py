"""Any OpenAI-compatible chat-completions endpoint with tool calling, through the openai package.

Retries with backoff on 429, 5xx and network errors are the openai client's
own (it honours Retry-After); what is still failing after them is Unavailable.
The client is built in a background thread, so its import overlaps the box's start.
"""

from __future__ import annotations

import threading
from typing import Any

from quinebox.agent.providers.base import Completion, ContextOverflow, ProviderError, Rejected, Unavailable

REQUEST_TIMEOUT = 300.0


class OpenAIProvider:
    def __init__(self, model: str, *, api_key: str | None, base_url: str | None, max_retries: int):
        self.name = model
        self._client: Any = None
        self._error: Exception | None = None
        self._ready = threading.Thread(target=self._build, args=(api_key, base_url, max_retries), daemon=True)
        self._ready.start()

    def _build(self, api_key: str | None, base_url: str | None, max_retries: int) -> None:
        try:
            import openai

            self._openai = openai
            self._client = openai.OpenAI(api_key=api_key or "unset", base_url=base_url, max_retries=max_retries, timeout=REQUEST_TIMEOUT)
        except Exception as exc:  # noqa: BLE001 - reported on the first call, as the provider's failure
            self._error = exc

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        self._ready.join()
        if self._client is None:
            raise Rejected(f"cannot set up the openai client: {self._error}")
        openai = self._openai
        try:
            response = self._client.chat.completions.create(model=self.name, messages=messages, tools=tools)
        except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
            raise Rejected(f"the model provider refused the credentials ({exc.status_code}): check OPENAI_API_KEY") from None
        except openai.NotFoundError as exc:
            raise Rejected(f"the model provider does not know model {self.name!r} ({exc.status_code}): check QUINEBOX_MODEL or --model") from None
        except openai.BadRequestError as exc:
            text = str(exc)
            if getattr(exc, "code", None) == "context_length_exceeded" or "context length" in text.lower() or "context_length" in text:
                raise ContextOverflow("the conversation no longer fits the model's context window") from None
            raise ProviderError(f"the model provider refused the request: {text[:300]}") from None
        except (openai.RateLimitError, openai.InternalServerError, openai.APIConnectionError, openai.APITimeoutError) as exc:
            raise Unavailable(f"the model provider stayed unavailable after retries: {type(exc).__name__}: {str(exc)[:200]}") from None
        except openai.APIStatusError as exc:
            if exc.status_code >= 500:
                raise Unavailable(f"the model provider stayed unavailable after retries ({exc.status_code})") from None
            raise ProviderError(f"the model provider answered {exc.status_code}: {str(exc)[:300]}") from None
        if not response.choices:
            raise ProviderError("the model provider returned no choices")
        choice = response.choices[0]
        message: dict[str, Any] = {"role": "assistant", "content": choice.message.content}
        if choice.message.tool_calls:
            message["tool_calls"] = [
                {"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": call.function.arguments}}
                for call in choice.message.tool_calls
            ]
        usage = response.usage.model_dump(include={"prompt_tokens", "completion_tokens", "total_tokens"}) if response.usage else {}
        return Completion(message=message, usage=usage, finish_reason=choice.finish_reason)

"""OpenAI response objects and stream chunks for /v1/completions and /v1/chat/completions.

Responses are plain dicts shaped exactly like OpenAI's, built by small functions rather than
response models, so the JSON on the wire is easy to compare with OpenAI's documentation.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any, Literal

from cascade.protocol.stats import SpecStats
from gateway.openai.logprobs import chat_logprobs, completion_logprobs


@dataclass(frozen=True)
class ResponseMeta:
    """The id, created time and model every object (and chunk) of one response shares."""

    id: str
    created: int
    model: str

    @classmethod
    def new(cls, prefix: Literal["cmpl", "chatcmpl"], model: str) -> ResponseMeta:
        return cls(id=f"{prefix}-{uuid.uuid4().hex}", created=int(time.time()), model=model)

    def header(self, object_type: str) -> dict[str, Any]:
        return {"id": self.id, "object": object_type, "created": self.created, "model": self.model}


def usage(prompt_tokens: int, completion_tokens: int,
          num_deferred: int | None = None, spec: SpecStats | None = None) -> dict[str, Any]:
    """OpenAI's usage; a speculative cascade adds ``num_deferred_tokens`` (the drafted
    positions the target decided); ``spec`` adds what speculation did under ``cascade``."""
    counts: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if num_deferred is not None:
        counts["num_deferred_tokens"] = num_deferred
    if spec is not None:
        counts["cascade"] = speculation_usage(spec)
    return counts


def speculation_usage(spec: SpecStats) -> dict[str, Any]:
    """A generation's rounds (target passes), those that verified a draft, drafted and
    accepted tokens, and vLLM's acceptance rate and mean acceptance length (bonus token
    included)."""
    return {"rounds": spec.num_target_passes, "drafted_rounds": spec.num_drafts,
            "draft_tokens": spec.num_draft_tokens, "accepted_tokens": spec.num_accepted_tokens,
            "acceptance_rate": round(spec.acceptance_rate, 4),
            "mean_acceptance_length": round(spec.mean_acceptance_length, 4)}


def completion_choice(text: str, finish_reason: str | None, index: int = 0,
                      logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"index": index, "text": text, "finish_reason": finish_reason, "logprobs": logprobs}


def chat_choice(content: str, finish_reason: str, index: int = 0,
                logprobs: dict[str, Any] | None = None,
                tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The choice's message: its content, or (``tool_calls``) the calls it makes."""
    if tool_calls:
        message = {"role": "assistant", "content": None, "tool_calls": tool_calls}
        finish_reason = "tool_calls"
    else:
        message = {"role": "assistant", "content": content}
    return {"index": index, "message": message, "finish_reason": finish_reason,
            "logprobs": logprobs}


@dataclass(frozen=True)
class ResponseFormat:
    """What one endpoint's responses look like: /v1/completions or /v1/chat/completions."""

    kind: str
    """"completion" or "chat" (the request's and the stream view's name for it)."""
    id_prefix: Literal["cmpl", "chatcmpl"]
    object: str
    """The ``object`` of a whole response."""
    chunk_object: str
    """The ``object`` of a streamed chunk."""
    choice: Callable[..., dict[str, Any]]
    """(text, finish_reason, index, logprobs, tool_calls) -> one choice of a whole response."""
    logprobs: Callable[..., dict[str, Any]]
    """(items, offset) -> the ``logprobs`` of a choice or chunk."""

    def meta(self, model: str) -> ResponseMeta:
        return ResponseMeta.new(self.id_prefix, model)


def _completion_choice(text, finish_reason, index, logprobs, tool_calls=None):
    return completion_choice(text, finish_reason, index, logprobs)


def _chat_logprobs(items, offset: int = 0):
    return chat_logprobs(items)


COMPLETION = ResponseFormat("completion", "cmpl", "text_completion", "text_completion",
                            _completion_choice, completion_logprobs)
CHAT = ResponseFormat("chat", "chatcmpl", "chat.completion", "chat.completion.chunk",
                      chat_choice, _chat_logprobs)
FORMATS = {f.kind: f for f in (COMPLETION, CHAT)}
"""Each endpoint's format, by kind."""


def choices_response(meta: ResponseMeta, response_format: ResponseFormat,
                     choices: list[dict[str, Any]], usage_: dict[str, int]) -> dict[str, Any]:
    """A whole response of one or more choices."""
    return {**meta.header(response_format.object), "choices": choices, "usage": usage_}


def completion_chunk(
    meta: ResponseMeta, text: str, finish_reason: str | None, include_usage: bool,
    index: int = 0, logprobs: dict[str, Any] | None = None
) -> dict[str, Any]:
    choice = completion_choice(text, finish_reason, index, logprobs)
    return _chunk(meta.header(COMPLETION.chunk_object), choice, include_usage)


def chat_chunk(
    meta: ResponseMeta, delta: dict[str, Any], finish_reason: str | None, include_usage: bool,
    index: int = 0, logprobs: dict[str, Any] | None = None
) -> dict[str, Any]:
    """delta is {"role": "assistant", "content": ""} first, then {"content": ...}, and {} last."""
    choice = {"index": index, "delta": delta, "finish_reason": finish_reason,
              "logprobs": logprobs}
    return _chunk(meta.header(CHAT.chunk_object), choice, include_usage)


def with_round(chunk: dict[str, Any], round_json: dict[str, Any] | None) -> dict[str, Any]:
    """The chunk with the ``cascade`` round extension, when the request asked for it."""
    return chunk if round_json is None else {**chunk, "cascade": round_json}


def usage_chunk(meta: ResponseMeta, object_type: str, usage_: dict[str, int]) -> dict[str, Any]:
    """The last chunk when stream_options.include_usage is set: no choices, only the usage."""
    return {**meta.header(object_type), "choices": [], "usage": usage_}


def _chunk(header: dict[str, Any], choice: dict[str, Any], include_usage: bool) -> dict[str, Any]:
    chunk = {**header, "choices": [choice]}
    if include_usage:
        chunk["usage"] = None  # OpenAI sends null usage on every chunk but the last
    return chunk


def model_card(model_name: str, created: int, max_model_len: int,
               facts: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's model object, with vLLM's ``max_model_len`` (the context length) and what the
    verifiers serve it in (``dtype``)."""
    return {"id": model_name, "object": "model", "created": created, "owned_by": "cascade",
            "max_model_len": max_model_len, **facts}

"""OpenAI request models and response builders for /v1/completions and /v1/chat/completions.

Requests accept and ignore fields Cascade does not use (OpenAI clients send ``user``,
``logprobs: null`` and the like), so off-the-shelf clients work unchanged. Responses are plain
dicts shaped exactly like OpenAI's, built by small functions rather than response models, so the
JSON on the wire is easy to compare with OpenAI's documentation.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from cascade.protocol.grammar import Grammar
from cascade.protocol.limits import RequestInvalid
from cascade.protocol.options import GenerationOptions, Lenient, valid_text
from cascade.protocol.stats import SpecStats
from cascade.protocol.limits import MAX_LOGPROBS
from gateway.openai.structured import StructuredFields
from gateway.openai.tools import ToolFields


MAX_CHOICES = 16
"""Most choices (prompts times n) one request may ask for: each is a session."""


class StreamOptions(Lenient):
    include_usage: bool = False
    """Send a last chunk with empty choices and the usage before [DONE]."""


class GenerationFields(GenerationOptions, StructuredFields):
    """Fields shared by completions and chat completions: the generation options (the one
    mapping's, cascade.protocol.requests), the structured outputs (gateway.openai.structured), plus
    what only the OpenAI HTTP API has."""

    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=MAX_CHOICES)
    """Choices per prompt, each its own session (seeds derived per choice)."""
    cascade_rounds: bool = False
    """Cascade extension: each streamed chunk carries what its round did (gateway.openai.rounds)."""

    @field_validator("cascade_rounds")
    @classmethod
    def _rounds_need_stream(cls, value: bool, info: ValidationInfo) -> bool:
        if value and not info.data.get("stream"):
            raise ValueError("needs \"stream\": true (rounds are described per streamed chunk)")
        return value

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(GenerationFields):
    """POST /v1/completions."""

    prompt: Any
    """A string or token ids (a list of ints), or a list of them (a batch: one choice per
    prompt and n, in order)."""
    max_tokens: int = 16
    """OpenAI's default for completions."""
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    """Return the target's log-probability of each token and of this many alternatives."""
    echo: bool = False
    """Answer the prompt, then the completion; with logprobs, the prompt's first (gateway.openai.echo;
    with max_tokens 0: the prompt alone)."""
    best_of: int | None = Field(None, ge=1, le=MAX_CHOICES)
    """Generate this many completions per prompt and return the n whose tokens have the
    highest total log-probability under the target (gateway.openai.choices.best); not streamed."""

    @field_validator("best_of")
    @classmethod
    def _best_of_covers_n(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and value < info.data.get("n", 1):
            raise ValueError(f"must be at least n ({info.data.get('n')}), got {value}")
        if value is not None and value > 1 and info.data.get("stream"):
            raise ValueError("cannot be used with stream (the best completions are known only "
                             "at the end)")
        return value

    @property
    def candidates(self) -> int:
        """Completions generated per prompt (best_of, else n)."""
        return self.best_of or self.n

    @property
    def requested_logprobs(self) -> int | None:
        return self.logprobs

    @field_validator("prompt")
    @classmethod
    def _prompts(cls, value: Any) -> list[str | list[int]]:
        batch = value if isinstance(value, list) and value and all(
            isinstance(item, (str, list)) for item in value) else [value]
        if len(batch) > MAX_CHOICES:
            raise ValueError(f"at most {MAX_CHOICES} prompts per request, got {len(batch)}")
        return [_one_prompt(item) for item in batch]


def _one_prompt(value: Any) -> str | list[int]:
    if _is_token_ids(value):
        if not value:
            raise ValueError("must not be empty")
        return value
    if not isinstance(value, str):
        raise ValueError("must be a string, a list of token ids, or a list of those")
    if not value:
        raise ValueError("must not be empty")
    return valid_text(value)


def _is_token_ids(value: Any) -> bool:
    """A list of ints (not bools, which JSON's true and false become)."""
    return isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value)


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """``messages`` as the chat template reads them."""
    return [m.model_dump(exclude_none=True, exclude_defaults=True) | {
        "role": m.role, "content": m.content} for m in messages]


class ChatMessage(Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str
    """A string; a list of text parts ({"type": "text", "text": ...}) is joined into one; an
    assistant turn that called tools may have none."""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    """An assistant turn's tool calls (gateway.openai.tools)."""
    tool_call_id: str | None = None
    """A tool turn: the call it answers."""

    @model_validator(mode="before")
    @classmethod
    def _calls_need_no_content(cls, data: Any) -> Any:
        if (isinstance(data, dict) and data.get("tool_calls") and data.get("content") is None
                and data.get("role") == "assistant"):
            return {**data, "content": ""}
        return data

    @field_validator("content", mode="before")
    @classmethod
    def _join_text_parts(cls, value: Any) -> Any:
        if isinstance(value, str):
            return valid_text(value)
        if not isinstance(value, list):
            return value
        if all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
               for p in value):
            return valid_text("".join(part["text"] for part in value))
        raise ValueError('must be a string or a list of {"type": "text", "text": ...} parts')


class ToolCallFunction(Lenient):
    name: str
    arguments: str = ""
    """JSON text (as OpenAI returns it); the template gets it parsed (empty: no arguments)."""

    @field_validator("arguments")
    @classmethod
    def _json_arguments(cls, value: str) -> str:
        try:
            json.loads(value or "{}")
        except json.JSONDecodeError as exc:
            raise ValueError(f"must be JSON text, as the call returned them ({exc})") from None
        return value


class ToolCall(Lenient):
    id: str = ""
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatCompletionRequest(GenerationFields, ToolFields):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    """None generates up to the server's limit (or what the context has left)."""
    max_completion_tokens: int | None = None
    """Newer OpenAI name for max_tokens; wins when both are given."""
    logprobs: bool = False
    """Return the target's log-probability of each token."""
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    """With logprobs: also this many most likely alternatives per token."""

    @field_validator("top_logprobs")
    @classmethod
    def _top_needs_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value and not info.data.get("logprobs"):
            raise ValueError('needs "logprobs": true')
        return value

    @property
    def requested_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def requested_max_tokens(self) -> int | None:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens

    def template_messages(self) -> list[dict[str, Any]]:
        return template_messages(self.messages)

    def requested_grammar(self) -> tuple[Grammar, str] | None:
        """A structured-output field's grammar, or the one tool_choice imposes; not both."""
        structured, tool = super().requested_grammar(), self.tool_grammar()
        if tool is None:
            return structured
        if structured is not None:
            raise RequestInvalid(f"Invalid value for 'tool_choice': a required or named tool "
                                 f"call is a structured output of its own; leave "
                                 f"'{structured[1]}' out.", "tool_choice")
        return tool, "tools"


# ----- responses -----------------------------------------------------------------------------


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


def completion_response(
    meta: ResponseMeta, text: str, finish_reason: str, usage_: dict[str, int],
    logprobs: dict[str, Any] | None = None
) -> dict[str, Any]:
    return choices_response(meta, "completion",
                            [completion_choice(text, finish_reason, 0, logprobs)], usage_)


def chat_response(
    meta: ResponseMeta, content: str, finish_reason: str, usage_: dict[str, int],
    logprobs: dict[str, Any] | None = None, tool_calls: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    choice = chat_choice(content, finish_reason, 0, logprobs, tool_calls)
    return choices_response(meta, "chat", [choice], usage_)


def choices_response(meta: ResponseMeta, kind: str, choices: list[dict[str, Any]],
                     usage_: dict[str, int]) -> dict[str, Any]:
    """A whole response of one or more choices (``kind``: "completion" or "chat")."""
    object_type = "chat.completion" if kind == "chat" else "text_completion"
    return {**meta.header(object_type), "choices": choices, "usage": usage_}


def completion_chunk(
    meta: ResponseMeta, text: str, finish_reason: str | None, include_usage: bool,
    index: int = 0, logprobs: dict[str, Any] | None = None
) -> dict[str, Any]:
    choice = completion_choice(text, finish_reason, index, logprobs)
    return _chunk(meta.header("text_completion"), choice, include_usage)


def chat_chunk(
    meta: ResponseMeta, delta: dict[str, str], finish_reason: str | None, include_usage: bool,
    index: int = 0, logprobs: dict[str, Any] | None = None
) -> dict[str, Any]:
    """delta is {"role": "assistant", "content": ""} first, then {"content": ...}, and {} last."""
    choice = {"index": index, "delta": delta, "finish_reason": finish_reason,
              "logprobs": logprobs}
    return _chunk(meta.header("chat.completion.chunk"), choice, include_usage)


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

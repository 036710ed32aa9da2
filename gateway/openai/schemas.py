"""OpenAI request models for /v1/completions and /v1/chat/completions (the responses:
``gateway.openai.responses``).

Requests accept and ignore fields Cascade does not use (OpenAI clients send ``user``,
``logprobs: null`` and the like), so off-the-shelf clients work unchanged.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from cascade.protocol.grammar import Grammar
from cascade.protocol.limits import RequestInvalid
from cascade.protocol.request.options import GenerationOptions, Lenient, valid_text
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
    mapping's, cascade.protocol.request.mapping), the structured outputs (gateway.openai.structured), plus
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

    @property
    def requested_logprobs(self) -> int | None:
        """Alternatives asked per token (None: no logprobs); each endpoint names it its way."""
        raise NotImplementedError


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

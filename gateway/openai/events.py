"""A generation's server-sent events in OpenAI's chunk shapes, each round's last event carrying
an ``id:`` (``<session id>.<round>``) a client resumes after (gateway.resume).

``StreamView`` is how one stream looks (kind, response id, stop strings, options): it is stored
with the session, so a stream resumed on any gateway continues the same response.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, replace
from typing import Any

from cascade.protocol.request.prediction import prediction_usage
from gateway.openai import responses
from gateway.sessions.generation import GenerationFailed
from gateway.openai.streaming import Delta, sse_event
from gateway.openai.tools import streamed_calls, tool_calls_of


@dataclass(frozen=True)
class Usage:
    num_prompt: int
    is_cascade: bool
    """A speculative cascade also reports its deferred positions."""
    prediction: tuple[int, ...] = ()
    """The request's predicted output (token ids): the usage says how much of it was kept."""

    def of(self, last: Delta) -> dict:
        deferred = last.spec.num_deferred_tokens if self.is_cascade and last.spec else None
        counts = responses.usage(self.num_prompt, last.completion_tokens, deferred, last.spec)
        if self.prediction:
            counts["completion_tokens_details"] = prediction_usage(self.prediction,
                                                                   last.token_ids)
        return counts


@dataclass(frozen=True)
class StreamView:
    kind: str
    """"completion" or "chat"."""
    meta: responses.ResponseMeta
    stop: tuple[str, ...]
    include_usage: bool
    rounds: bool
    """The request asked for per-round cascade objects."""
    usage: Usage
    choice: int = 0
    """The choice's index in its response (n > 1, or a batch of prompts)."""
    logprobs: bool = False
    """The request asked for log-probabilities (each chunk carries its tokens')."""
    tools: tuple[str, ...] = ()
    """The tools whose calls the text is read for (gateway.openai.tools); the text is held back
    until it is whole."""
    echo: str | None = None
    """Completions with echo: the prompt's text, sent in front of the first round's
    (gateway.openai.echo); None: no echo."""
    echo_alone: bool = False
    """Echo with max_tokens 0: the prompt is the whole answer (the generated token is hidden)."""

    def format_logprobs(self, items, offset: int = 0) -> dict[str, Any] | None:
        """The ``logprobs`` of a choice or chunk holding ``items`` (None: not asked)."""
        if not self.logprobs:
            return None
        return responses.FORMATS[self.kind].logprobs(items, offset)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> StreamView:
        raw = json.loads(text)
        return cls(raw["kind"], responses.ResponseMeta(**raw["meta"]), tuple(raw["stop"]),
                   raw["include_usage"], raw["rounds"], Usage(**raw["usage"]),
                   raw.get("choice", 0), raw.get("logprobs", False),
                   tuple(raw.get("tools", ())), raw.get("echo"), raw.get("echo_alone", False))


def events(view: StreamView, deltas: AsyncIterator[Delta], resumed: bool = False
           ) -> AsyncIterator[str]:
    """The SSE events of ``deltas``; ``resumed``: the client already has the stream's start."""
    return EVENTS[view.kind](view, deltas, resumed)


async def completion_events(view: StreamView, deltas: AsyncIterator[Delta],
                            resumed: bool = False) -> AsyncIterator[str]:
    meta, include_usage = view.meta, view.include_usage
    offset = 0
    async for delta in deltas:
        group = []
        if delta.text or delta.finish_reason or delta.round or (view.logprobs and delta.logprobs):
            chunk = responses.completion_chunk(meta, delta.text, delta.finish_reason, include_usage,
                                             view.choice,
                                             view.format_logprobs(delta.logprobs, offset))
            group.append(responses.with_round(chunk, _round_json(delta)))
        if delta.finish_reason and include_usage:
            group.append(responses.usage_chunk(meta, responses.COMPLETION.chunk_object,
                                               view.usage.of(delta)))
        offset += sum(len(item.token) for item in delta.logprobs)
        for event in _framed(group, delta.event_id):
            yield event


async def chat_events(view: StreamView, deltas: AsyncIterator[Delta], resumed: bool = False
                      ) -> AsyncIterator[str]:
    meta, include_usage = view.meta, view.include_usage
    first = not resumed
    if view.tools:
        deltas = held_back(deltas)
    async for delta in deltas:
        group = []
        if first:  # sent with the first generated chunk, so errors before it still get a status
            group.append(responses.chat_chunk(meta, {"role": "assistant", "content": ""}, None,
                                            include_usage, view.choice))
            first = False
        calls = _stable_ids(view, tool_calls_of(view.tools, delta.text, delta.finish_reason))
        for tool_calls in streamed_calls(calls or []):
            group.append(responses.chat_chunk(meta, {"tool_calls": tool_calls}, None,
                                            include_usage, view.choice))
        if not calls and (delta.text or delta.round or (view.logprobs and delta.logprobs)):
            chunk = responses.chat_chunk(meta, {"content": delta.text}, None, include_usage,
                                       view.choice, view.format_logprobs(delta.logprobs))
            group.append(responses.with_round(chunk, _round_json(delta)))
        if delta.finish_reason:
            group.append(responses.chat_chunk(meta, {}, "tool_calls" if calls
                                            else delta.finish_reason, include_usage,
                                            view.choice))
            if include_usage:
                group.append(responses.usage_chunk(meta, responses.CHAT.chunk_object,
                                                 view.usage.of(delta)))
        for event in _framed(group, delta.event_id):
            yield event


async def held_back(deltas: AsyncIterator[Delta]) -> AsyncIterator[Delta]:
    """One delta with the whole text (a tool call is known only then); none when the client
    has it all (a stream resumed after its final round: every event went out with that
    round's id)."""
    parts, last = [], None
    async for delta in deltas:
        parts.append(delta.text)
        last = delta
    if last is None:
        return
    if last.finish_reason is None:
        raise GenerationFailed("The generation ended without a finish reason.")
    yield replace(last, text="".join(parts))


def _stable_ids(view: StreamView, calls: list[dict[str, Any]] | None
                ) -> list[dict[str, Any]] | None:
    """``calls`` with ids derived from the response's, so a stream resumed from its start
    names each call as the original stream did."""
    if not calls:
        return calls
    seeds = (f"{view.meta.id}.{view.choice}.{i}".encode() for i in range(len(calls)))
    return [{**call, "id": "call_" + hashlib.sha256(seed).hexdigest()[:24]}
            for call, seed in zip(calls, seeds)]


def _framed(group: list[dict[str, Any]], event_id: str | None) -> list[str]:
    """The group's events; the last carries the round's id (once all of them arrived, the
    client has the whole round)."""
    return [sse_event(payload, event_id if i == len(group) - 1 else None)
            for i, payload in enumerate(group)]


def _round_json(delta: Delta) -> dict[str, Any] | None:
    return delta.round.to_json() if delta.round else None


EVENTS = {responses.COMPLETION.kind: completion_events, responses.CHAT.kind: chat_events}
"""Each endpoint's stream of events, by kind."""

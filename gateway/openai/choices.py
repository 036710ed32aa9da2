"""Responses of several choices: n > 1, or a batch of prompts on /v1/completions. Each choice is
a session of its own (its own seed, derived from the request's: seed + choice index; its own
slot of the caller's key), answered together: a non-streamed response lists every choice; a
stream interleaves their chunks as they come, each with its choice's ``index`` and its own
session's event ids (a client resumes each choice by its session), then one usage chunk with
the totals when asked for."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

from cascade.protocol.stats import SpecStats
from gateway.openai import responses
from gateway.openai.events import StreamView, Usage, events
from gateway.sessions.generation import GenerationRequest
from gateway.openai.streaming import Delta, sse_event
from gateway.openai.tools import tool_calls_of

_DONE = object()


def per_choice(requests: list[GenerationRequest], n: int) -> list[GenerationRequest]:
    """Each request n times, in order, choice i seeded with the request's seed + i; all in
    one group (a prompt's choices meet on one verifier, which computes the prompt once)."""
    group = secrets.token_hex(8) if n > 1 else ""
    return [replace(r, sampling=replace(r.sampling, seed=(r.sampling.seed + i) % 2**64),
                    group=group)
            for r in requests for i in range(n)]


def scored(request: GenerationRequest) -> GenerationRequest:
    """``request`` returning each token's log-probability (best_of ranks by them)."""
    logprobs = request.sampling.logprobs
    return replace(request, sampling=replace(request.sampling, logprobs=logprobs or 0))


def best(choice_views: list[StreamView], results: list[tuple[str, Delta]], count: int, n: int,
         show_logprobs: bool) -> tuple[list[StreamView], list[tuple[str, Delta]]]:
    """Of each prompt's ``count`` candidates (consecutive), the ``n`` whose tokens have the
    highest total log-probability, best first (OpenAI's best_of); their log-probabilities are
    shown only when the request asked for them."""
    kept = []
    for start in range(0, len(results), count):
        group = range(start, start + count)
        kept += sorted(group, key=lambda i: -sum(e.logprob or 0.0  # an echoed prompt's first
                                                 for e in results[i][1].logprobs))[:n]
    return ([replace(choice_views[i], logprobs=show_logprobs) for i in kept],
            [results[i] for i in kept])


def views(kind: str, meta: responses.ResponseMeta, body, requests: list[GenerationRequest]
          ) -> list[StreamView]:
    """One view per choice (no per-choice usage chunk: the totals come once, at the end)."""
    return [StreamView(kind, meta, tuple(body.stop), False, body.cascade_rounds,
                       Usage(len(r.prompt_tokens), not r.acceptance.rule.is_lossless), i,
                       r.sampling.logprobs is not None, getattr(body, "tool_names", ()))
            for i, r in enumerate(requests)]


def usage_of(prompts: list[list[int]], lasts: list[Delta]) -> dict[str, Any]:
    """Each distinct prompt once (n choices of a prompt share it), every choice's tokens and
    rounds."""
    return responses.usage(sum(len(p) for p in prompts),
                         sum(last.completion_tokens for last in lasts),
                         spec=sum((last.spec or SpecStats() for last in lasts), SpecStats()))


def response(kind: str, meta: responses.ResponseMeta, choice_views: list[StreamView],
             results: list[tuple[str, Delta]], usage_: dict[str, int]) -> dict:
    response_format = responses.FORMATS[kind]

    def choice(i: int, view: StreamView, text: str, last: Delta) -> dict:
        return response_format.choice(text, last.finish_reason, i,
                                      view.format_logprobs(last.logprobs),
                                      tool_calls_of(view.tools, text, last.finish_reason))

    return responses.choices_response(meta, response_format, [
        choice(i, view, text, last)
        for i, (view, (text, last)) in enumerate(zip(choice_views, results))], usage_)


async def stream(kind: str, meta: responses.ResponseMeta, choice_views: list[StreamView],
                 deltas: list[AsyncIterator[Delta]], include_usage: bool,
                 usage: Callable[[list[Delta]], dict[str, int]]) -> AsyncIterator[str]:
    """Every choice's events as they come; the usage chunk after the last."""
    lasts: list[Delta | None] = [None] * len(deltas)

    async def tapped(i: int, source: AsyncIterator[Delta]) -> AsyncIterator[Delta]:
        async for delta in source:
            lasts[i] = delta
            yield delta

    async for event in merged([events(v, tapped(i, d))
                               for i, (v, d) in enumerate(zip(choice_views, deltas))]):
        yield event
    if include_usage:
        yield sse_event(responses.usage_chunk(meta, responses.FORMATS[kind].chunk_object,
                                            usage([d for d in lasts if d is not None])))


async def merged(streams: list[AsyncIterator[str]]) -> AsyncIterator[str]:
    """The items of every stream as they come; a failure in one is raised here (and the
    others are cancelled)."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(source: AsyncIterator[str]) -> None:
        try:
            async for item in source:
                await queue.put(item)
            await queue.put(_DONE)
        except BaseException as exc:  # noqa: BLE001 - handed to the reader
            await queue.put(exc)

    tasks = [asyncio.ensure_future(pump(s)) for s in streams]
    try:
        for _ in range(len(tasks)):
            while (item := await queue.get()) is not _DONE:
                if isinstance(item, BaseException):
                    raise item
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

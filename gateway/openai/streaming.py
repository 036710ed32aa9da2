"""From generated chunks to text deltas, and from events to an OpenAI-style SSE response."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Send

from cascade.protocol.logprobs import TokenLogprobs
from cascade.protocol.settings import FinishReason
from cascade.protocol.stats import SpecStats
from gateway.openai.detokenize import Decoder, TextStream
from gateway.openai.errors import as_api_error, error_body, error_response
from gateway.sessions.generation import GeneratedChunk, GenerationFailed
from gateway.sessions.generation import stop_early
from gateway.openai.logprobs import LogprobEntry, entries
from gateway.openai.rounds import RoundReader, RoundView

log = logging.getLogger(__name__)

FINISH_REASONS = {FinishReason.STOP: "stop", FinishReason.LENGTH: "length"}
DONE_EVENT = "data: [DONE]\n\n"
CLOSE_TIMEOUT_S = 5.0
"""How long closing an abandoned generation may take before the gateway stops waiting."""
SEND_TIMEOUT_S = 60.0
"""Longest one event may wait for the client to read before the stream is closed (a client
that stopped reading would otherwise hold its session, and its API key's slot, forever)."""


@dataclass(frozen=True)
class Delta:
    """New visible text after one chunk; the last delta has a finish_reason."""

    text: str
    finish_reason: str | None
    completion_tokens: int
    """Generated tokens so far: after a stop string, those up to and including the token that
    completed it (gateway.openai.detokenize.TextStream.num_tokens)."""
    round: RoundView | None = None
    """What the chunk's round did, when the request asked for rounds (gateway.openai.rounds)."""
    event_id: str | None = None
    """``<session id>.<round>``: where a client resumes after this delta (gateway.openai.events)."""
    logprobs: tuple[LogprobEntry, ...] = ()
    """The chunk's tokens' log-probabilities (the request asked; collect: all of them)."""
    prompt_logprobs: tuple[TokenLogprobs, ...] = ()
    """The chunk's ``GeneratedChunk.prompt_logprobs`` (the first round's, for gateway.openai.echo)."""
    token_ids: tuple[int, ...] = ()
    """The last delta only: every generated token id counted in completion_tokens."""
    spec: SpecStats | None = None
    """The last delta only: the acceptance counters of every round of the generation (its
    deferred positions included)."""


async def text_deltas(chunks: AsyncIterator[GeneratedChunk], tokenizer: Decoder,
                      stops: Sequence[str], rounds: bool = False, seen_rounds: int = 0
                      ) -> AsyncIterator[Delta]:
    """One Delta per generated chunk; a stop string ends it early and closes the generation.
    With ``rounds`` each Delta also describes its round, token by token. Chunks of rounds up
    to ``seen_rounds`` (a resumed stream's start, which its client has) only advance the text:
    no Delta for them, not even for the final round when the client has it (its stream broke
    before the end marker)."""
    text = TextStream(tokenizer, stops)
    reader = RoundReader(text, tokenizer) if rounds else None
    last, seen_final, ids, spec = None, False, [], SpecStats()
    try:
        async for chunk in chunks:
            if last is not None:
                break  # nothing counts after the chunk that carried the finish_reason
            ids += chunk.token_ids
            spec.observe_round(chunk.stats, len(chunk.token_ids))
            final = chunk.finish_reason is not None
            before = text.num_tokens
            view = reader.read(chunk, final) if reader else None
            visible = view.text if view else text.add(chunk.token_ids, final=final)
            consumed = text.num_tokens  # a stop string ends the tokens where it completes
            event_id = f"{chunk.session_id}.{chunk.round}" if chunk.round else None
            scored = entries(chunk.token_ids[:consumed - before], chunk.logprobs, tokenizer)
            extra: dict[str, Any] = {"prompt_logprobs": chunk.prompt_logprobs}  # for echo
            is_seen = 0 < chunk.round <= seen_rounds
            if text.stopped:
                await stop_early(chunks)
                if not is_seen:
                    yield Delta(visible, "stop", consumed, view, event_id, scored,
                                **extra, token_ids=tuple(ids[:consumed]), spec=spec)
                return
            if is_seen:
                seen_final = final
                continue
            if final:  # let the generator run to its end before the last delta goes out
                finish = FINISH_REASONS[FinishReason(chunk.finish_reason)]
                last = Delta(visible, finish, consumed, view, event_id, scored,
                             **extra, token_ids=tuple(ids[:consumed]), spec=spec)
                continue
            yield Delta(visible, None, consumed, view, event_id, scored, **extra)
    finally:
        await _close(chunks)
    if last is None and not seen_final:
        raise GenerationFailed("The generation ended without a finish reason.")
    if last is not None:
        yield last


async def _close(chunks: Any) -> None:
    """Closes the orchestrator's stream so it releases the session, even on a cancelled request."""
    aclose = getattr(chunks, "aclose", None)
    if aclose is not None:
        with anyio.move_on_after(CLOSE_TIMEOUT_S, shield=True):
            await aclose()


async def collect(deltas: AsyncIterator[Delta]) -> tuple[str, Delta]:
    """(text, last delta) of a whole generation, for non-streamed replies; the last delta
    carries every token's log-probabilities."""
    parts: list[str] = []
    scored: list[LogprobEntry] = []
    last: Delta | None = None
    async for delta in deltas:
        parts.append(delta.text)
        scored += delta.logprobs
        last = delta
    if last is None or last.finish_reason is None:
        raise GenerationFailed("The generation ended without a finish reason.")
    return "".join(parts), replace(last, logprobs=tuple(scored))


def sse_event(payload: dict[str, Any], event_id: str | None = None) -> str:
    """One server-sent event as OpenAI frames it (``data: {json}`` and a blank line), with an
    ``id:`` line first when given."""
    data = f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"
    return f"id: {event_id}\n{data}" if event_id else data


class EventStreamResponse(StreamingResponse):
    """SSE with OpenAI's framing: the given events, then ``data: [DONE]``; no pings, no ids.

    Headers go out only once the first event exists, so a request refused before any output
    (overloaded, failed) still gets a real status code. Later errors become an error event.
    An event the client does not read within ``send_timeout_s`` closes the stream (the
    generation is closed and recorded cancelled: resumable). ``on_close`` runs when the
    response is over, however it ended (even if the stream never started).
    """

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[str], on_close: Callable[[], None] | None = None,
                 send_timeout_s: float = SEND_TIMEOUT_S) -> None:
        super().__init__(events, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._events, self._on_close, self.send_timeout_s = events, on_close, send_timeout_s

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self._on_close is not None:
                self._on_close()

    async def stream_response(self, send: Send) -> None:
        try:
            try:
                first = await anext(self._events, None)
            except Exception as exc:
                await self._send_error_response(send, exc)
                return
            start = {"type": "http.response.start", "status": self.status_code}
            await send({**start, "headers": self.raw_headers})
            if first is not None:
                await self._send(send, first)
                await self._send_rest(send)
            await self._send(send, DONE_EVENT)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except TimeoutError:  # the client stopped reading: nothing more can reach it
            log.warning("closed a stream whose client read nothing for %.0fs",
                        self.send_timeout_s)
        finally:
            with anyio.move_on_after(CLOSE_TIMEOUT_S, shield=True):
                await self._events.aclose()  # type: ignore[attr-defined]

    async def _send_rest(self, send: Send) -> None:
        while True:
            try:
                event = await anext(self._events)
            except StopAsyncIteration:
                return
            except Exception as exc:  # the status is already sent: report it in the stream
                err = as_api_error(exc)
                event = sse_event(error_body(err.message, err.type, err.param, err.code))
                await self._send(send, event)
                return
            await self._send(send, event)

    async def _send(self, send: Send, event: str) -> None:
        with anyio.fail_after(self.send_timeout_s):
            await send({"type": "http.response.body", "body": event.encode("utf-8"),
                        "more_body": True})

    @staticmethod
    async def _send_error_response(send: Send, exc: Exception) -> None:
        response = error_response(exc)
        start = {"type": "http.response.start", "status": response.status_code}
        await send({**start, "headers": response.raw_headers})
        await send({"type": "http.response.body", "body": response.body, "more_body": False})

"""What one client can take from a gateway: concurrent sessions per API key, and request size.

- **Sessions and tokens per key**: a request over its key's limit (concurrent sessions, or
  tokens in the last minute) gets HTTP 429 / gRPC RESOURCE_EXHAUSTED with Retry-After before
  anything runs; a session that is running finishes. Tokens are the prompt's (charged with its
  first generated tokens) and the generated ones; each session holds its prompt and
  ``max_tokens`` against the key's minute from the start until it generates them or ends
  (``Slot.hold``), so n choices of many tokens each cannot pass a check that only looked at
  what was already spent. The check reserves the session's
  slot in the same step (``KeyLimits.reserve``), so a burst cannot pass it before any of its
  streams has started. One ``KeyLimits`` per gateway process serves HTTP and gRPC, fresh and
  resumed streams alike (N gateways allow up to N times the limit). Without API keys every
  client is the same key (gateway.auth), so the limit caps the gateway's concurrent sessions.
- **Body size**: HTTP bodies over ``max_body_bytes`` get 413 before they are parsed or
  tokenized (a declared Content-Length is refused at once, a chunked body when it crosses the
  limit).
"""

from __future__ import annotations

import json
import time
from collections import Counter, deque
from collections.abc import AsyncGenerator

from gateway.openai.errors import error_body
from gateway.sessions.generation import GeneratedChunk, KeyAtLimit
from gateway.sessions.generation import StopGeneration, stop_early

WINDOW_S = 60.0


class KeyLimits:
    def __init__(self, per_key: int = 0, tokens_per_minute: int = 0) -> None:
        """``per_key``: concurrent sessions one API key may run; ``tokens_per_minute``: tokens
        its sessions may generate in any minute; 0 means no limit."""
        self.per_key, self.tokens_per_minute = per_key, tokens_per_minute
        self.active: Counter[str] = Counter()
        self.spent: dict[str, deque[tuple[float, int]]] = {}
        """key -> (when, tokens) of its recent chunks, the last minute's (keys with none are
        dropped)."""
        self.held: Counter[str] = Counter()
        """key -> tokens its running sessions may still generate (``Slot.hold``)."""

    def reserve(self, key: str) -> Slot:
        """A running-session slot for ``key``, taken at once (KeyAtLimit if it is at a limit).
        Release it when the session's stream ends (``Slot.release``, idempotent)."""
        if self.per_key and self.active[key] >= self.per_key:
            raise KeyAtLimit(f"This API key already runs {self.per_key} concurrent sessions, "
                             "its limit; retry when one has finished.")
        if self.tokens_per_minute and self._recent(key) >= self.tokens_per_minute:
            raise KeyAtLimit(f"This API key generated {self.tokens_per_minute} tokens in the "
                             "last minute, its limit; retry later.",
                             retry_after=self._retry_after(key))
        self.active[key] += 1
        return Slot(self, key)

    def charge(self, key: str, num_tokens: int) -> None:
        if self.tokens_per_minute and num_tokens:
            self.spent.setdefault(key, deque()).append((time.monotonic(), num_tokens))

    def hold(self, slot: Slot, num_prompt: int, max_new: int) -> None:
        """Hold ``slot``'s prompt and ``max_new`` tokens against its key's minute, or
        KeyAtLimit if the minute cannot take them besides what the key spent and holds."""
        if not self.tokens_per_minute:
            return
        key, cost = slot.key, num_prompt + max_new
        if cost > self.tokens_per_minute:
            raise KeyAtLimit(f"This request needs up to {cost} tokens (its prompt plus "
                             f"max_tokens), more than this API key's limit of "
                             f"{self.tokens_per_minute} per minute; lower max_tokens or send a "
                             "shorter prompt.")
        if self._recent(key) + self.held[key] + cost > self.tokens_per_minute:
            raise KeyAtLimit(f"This API key's sessions spent or hold {self.tokens_per_minute} "
                             "tokens of the last minute, its limit, with this request's "
                             "prompt and max_tokens; retry later.",
                             retry_after=self._retry_after(key))
        slot.held, slot.prompt = slot.held + cost, num_prompt
        self.held[key] += cost

    def unhold(self, slot: Slot, num_tokens: int) -> None:
        """Give back up to ``num_tokens`` of what ``slot`` holds."""
        given = min(slot.held, num_tokens)
        if given <= 0:  # nothing held (no token limit, or all of it generated)
            return
        slot.held -= given
        self.held[slot.key] -= given
        if self.held[slot.key] <= 0:
            del self.held[slot.key]

    def _retry_after(self, key: str) -> float:
        """Seconds until the key's oldest charge of the last minute leaves its window."""
        window = self.spent.get(key)
        return WINDOW_S - (time.monotonic() - window[0][0]) if window else WINDOW_S

    def _recent(self, key: str) -> int:
        window = self.spent.get(key)
        while window and time.monotonic() - window[0][0] > WINDOW_S:
            window.popleft()
        if not window:
            self.spent.pop(key, None)
            return 0
        return sum(n for _, n in window)

    def counted(self, slot: Slot, chunks: AsyncGenerator[GeneratedChunk, None]
                ) -> AsyncGenerator[GeneratedChunk, None]:
        """``chunks``, charging the slot's key for every newly generated token (not rounds a
        resumed stream replays) and releasing the slot when the stream ends."""
        return _counted(slot, chunks)


class Slot:
    """One running session of a key (see ``KeyLimits.reserve``)."""

    def __init__(self, limits: KeyLimits, key: str) -> None:
        self.limits, self.key, self.is_released = limits, key, False
        self.held = 0
        """Tokens held against its key's minute (``hold``) and not yet charged."""
        self.prompt = 0
        """Its prompt's tokens, charged with its first generated tokens (a request refused
        or failed before any is charged nothing)."""

    def hold(self, num_prompt: int, max_new: int) -> None:
        """Hold the session's prompt and ``max_new`` tokens against the key's minute
        (``KeyLimits.hold``): KeyAtLimit if they do not fit."""
        self.limits.hold(self, num_prompt, max_new)

    def charge(self, num_tokens: int) -> None:
        """Charge generated tokens (and, with the first, the prompt), out of what it holds."""
        num_tokens, self.prompt = num_tokens + self.prompt, 0
        self.limits.charge(self.key, num_tokens)
        self.limits.unhold(self, num_tokens)

    def release(self) -> None:
        """Give the slot back with what it still holds (once; later calls do nothing).
        Synchronous, so a cancelled close cannot skip it."""
        if self.is_released:
            return
        self.is_released = True
        self.limits.unhold(self, self.held)
        active = self.limits.active
        active[self.key] -= 1
        if active[self.key] <= 0:
            del active[self.key]


async def _counted(slot: Slot, chunks: AsyncGenerator[GeneratedChunk, None]
                   ) -> AsyncGenerator[GeneratedChunk, None]:
    try:
        async for chunk in chunks:
            if not chunk.is_replayed:
                slot.charge(len(chunk.token_ids))
            try:
                yield chunk
            except StopGeneration:  # pass a deliberate stop on (recorded as finished)
                await stop_early(chunks)
                return
    finally:
        try:
            await chunks.aclose()
        finally:  # even when closing is cancelled (a hung Redis past the close timeout)
            slot.release()


class BodyLimit:
    """ASGI middleware: 413 for HTTP request bodies over ``max_bytes``."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._refuse(send)
        messages, seen = [], 0  # read the body first (at most max_bytes), then replay it
        while True:
            message = await receive()
            messages.append(message)
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                return await self._refuse(send)
            if message["type"] != "http.request" or not message.get("more_body"):
                break

        async def replay():
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send) -> None:
        body = json.dumps(error_body(
            f"The request body is larger than {self.max_bytes} bytes, this gateway's limit; "
            "send a shorter prompt.", "invalid_request_error", code="request_too_large")).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

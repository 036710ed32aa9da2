"""What the gateway gives the speculation memory (cascade.serving.memory_stream): each session's
scope, sent to its drafter, and every finished generation, appended to the cluster's stream;
and each session's prefix-sharing scope (cascade.core.kv.prefix_cache), sent to both pods."""

from __future__ import annotations

import logging
from enum import Enum

import redis.asyncio as redis

from cascade.serving import memory_stream
from cascade.serving.memory_stream import MemoryMode, memory_scope

log = logging.getLogger(__name__)


class PrefixSharing(str, Enum):
    """Whose live prompts a session's pods may copy KV prefixes from."""

    PER_KEY = "per-key"
    """Sessions of the same API key only (its choices, its agent loop's turns): a copy makes
    the first token come sooner, so across keys it would time another key's prompt."""
    SHARED = "shared"
    """Every session (single-tenant deployments: one system prompt computed once for all)."""


def prefix_scope(mode: PrefixSharing, caller: str) -> str:
    """The prefix-sharing scope of a session of ``caller`` (an API key's identity)."""
    return "shared" if mode is PrefixSharing.SHARED else f"key:{caller}"


class MemorySharing:
    def __init__(self, client: redis.Redis, mode: MemoryMode, model: str, stream_len: int,
                 stream_bytes: int = memory_stream.DEFAULT_STREAM_BYTES) -> None:
        self.client, self.mode, self.model, self.stream_len = client, mode, model, stream_len
        self.stream_bytes = stream_bytes
        self._fitted = False
        """Whether ``stream_bytes`` was checked against Redis's maxmemory (on the first
        append)."""

    def scope(self, request) -> str | None:
        """The session's scope (None: the memory is off)."""
        return memory_scope(self.mode, self.model, request.caller)

    async def remember(self, request, generated: list[int]) -> None:
        """Share a finished generation with the drafters (best effort: a Redis error costs the
        memory one entry, never the generation)."""
        scope = self.scope(request)
        if scope is None:
            return
        try:
            if not self._fitted:
                self.stream_bytes = await memory_stream.fit_to_maxmemory(self.client,
                                                                         self.stream_bytes)
                self._fitted = True
            await memory_stream.append(self.client, scope, request.prompt_tokens,
                                       list(generated), self.stream_len,
                                       max_bytes=self.stream_bytes)
        except Exception as exc:  # noqa: BLE001 - the generation is complete and stored
            log.warning("speculation memory: could not share a generation: %s", exc)

"""The cluster's speculation memory on the wire: gateways append every finished generation to a
capped Redis stream; every drafter pod reads it (from its start when the pod starts, so a new or
restarted pod warms up) and indexes what it reads (``cascade.core.suffix_index``).

Entries: ``scope`` (whose generation it is: see ``memory_scope``), ``prompt_len`` and ``tokens``
(prompt and output ids, little-endian uint32). Sharing is best effort: a Redis outage stops it,
never a generation (gateways log a failed append; drafters retry their read with backoff and
keep drafting from what they hold).

Scopes keep tenants apart: under ``per-key`` a session drafts only from its own API key's past
generations (how fast a text is accepted would otherwise tell a caller whether another tenant
generated it); ``shared`` pools every key's; ``off`` neither appends nor drafts from the memory.
The model is part of every scope, so two models' ids never mix.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from enum import Enum

import numpy as np
import redis.asyncio as redis
from redis.exceptions import RedisError

log = logging.getLogger(__name__)

STREAM = "cascade:memory"
"""The stream's key."""
DEFAULT_STREAM_LEN = 20_000
"""Entries the stream keeps (the oldest are trimmed as new ones arrive)."""


class MemoryMode(str, Enum):
    PER_KEY = "per-key"
    SHARED = "shared"
    OFF = "off"


def memory_scope(mode: MemoryMode, model: str, caller: str) -> str | None:
    """The scope a session of ``caller`` (an API key's identity) drafts from and adds to; None
    with the memory off."""
    if mode is MemoryMode.OFF:
        return None
    return f"{model}|shared" if mode is MemoryMode.SHARED else f"{model}|key:{caller}"


def encode(scope: str, prompt: list[int], output: list[int]) -> dict[str, bytes | str | int]:
    tokens = np.asarray(prompt + output, dtype="<u4").tobytes()
    return {"scope": scope, "prompt_len": len(prompt), "tokens": tokens}


def decode(fields: dict) -> tuple[str, list[int]]:
    """(scope, token ids) of an entry's fields (as redis-py returns them, bytes keys)."""
    scope = fields[b"scope"].decode()
    return scope, np.frombuffer(fields[b"tokens"], dtype="<u4").astype(np.int64).tolist()


async def append(client: redis.Redis, scope: str, prompt: list[int], output: list[int],
                 max_len: int = DEFAULT_STREAM_LEN, stream: str = STREAM) -> None:
    """Add one finished generation, trimming the stream to ``max_len`` entries (exactly)."""
    await client.xadd(stream, encode(scope, prompt, output), maxlen=max_len, approximate=False)


class MemoryFeed:
    """Reads the stream from its start, then follows it, handing each batch of (scope,
    tokens) to ``index_batch`` in ``executor`` (off the event loop)."""

    def __init__(self, client: redis.Redis, index_batch: Callable[[list[tuple[str, list[int]]]],
                 None], executor=None, stream: str = STREAM, batch: int = 500,
                 block_ms: int = 2000, backoff_s: float = 1.0) -> None:
        self.client, self.index_batch, self.executor = client, index_batch, executor
        self.stream, self.batch, self.block_ms, self.backoff_s = stream, batch, block_ms, backoff_s
        self.last_id = "0"
        self.num_read = 0
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        failing = False
        while True:
            try:
                replies = await self.client.xread({self.stream: self.last_id}, count=self.batch,
                                                  block=self.block_ms)
            except (RedisError, OSError) as exc:
                if not failing:
                    log.warning("speculation memory: cannot read %s (%s); drafting from what "
                                "this pod holds until it can", self.stream, exc)
                failing = True
                await asyncio.sleep(self.backoff_s)
                continue
            failing = False
            for _, entries in replies or ():
                await self._index(entries)

    async def _index(self, entries) -> None:
        """Index a batch; an entry that does not decode is skipped (logged), and a failure of
        the index costs its batch, never the feed."""
        batch = []
        for entry_id, fields in entries:
            try:
                batch.append(decode(fields))
            except (KeyError, ValueError, UnicodeDecodeError) as exc:
                log.warning("speculation memory: skipping malformed entry %s (%r)", entry_id, exc)
        try:
            await asyncio.get_running_loop().run_in_executor(self.executor, self.index_batch,
                                                             batch)
        except Exception:  # noqa: BLE001 - the memory is best effort; drafting goes on
            log.exception("speculation memory: could not index %d entries", len(batch))
        self.last_id = entries[-1][0]
        self.num_read += len(entries)

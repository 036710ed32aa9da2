"""The cluster's speculation memory on the wire: gateways append every finished generation to a
capped Redis stream; every drafter pod reads it (from its start when the pod starts, so a new or
restarted pod warms up) and indexes what it reads (``cascade.core.memory.suffix_index``).

Entries: ``scope`` (whose generation it is: see ``memory_scope``), ``prompt_len`` and ``tokens``
(prompt and output ids, little-endian uint32). Sharing is best effort: a Redis outage stops it,
never a generation (gateways log a failed append; drafters retry their read with backoff and
keep drafting from what they hold).

The stream shares Redis (and its ``maxmemory``, under ``noeviction``) with the sessions, so it
is capped twice: at ``max_len`` entries and at ``max_bytes`` (its entries' fields, counted in
``{cascade:memory}:bytes`` by the script that appends and trims, so count and stream change
together). An entry larger than the whole cap is not kept. Gateways take the smaller of
``--memory-stream-max-bytes`` and a quarter of Redis's ``maxmemory`` (``fit_to_maxmemory``): one
key's long generations cannot fill Redis for every tenant.

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
from typing import Any

import numpy as np
import redis.asyncio as redis
from redis.exceptions import RedisError

log = logging.getLogger(__name__)

STREAM = "cascade:memory"
"""The stream's key."""
DEFAULT_STREAM_LEN = 20_000
"""Entries the stream keeps (the oldest are trimmed as new ones arrive)."""
DEFAULT_STREAM_BYTES = 128 << 20
"""Bytes the stream's entries may hold (the oldest are trimmed as new ones arrive)."""
MAXMEMORY_SHARE = 4
"""The stream takes at most 1/MAXMEMORY_SHARE of Redis's maxmemory (where one is set)."""
ENTRY_OVERHEAD_BYTES = 64
"""Counted per entry on top of its fields (its id and Redis's bookkeeping)."""

APPEND_SCRIPT = """
local max_len, max_bytes, overhead = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local size = overhead
for i = 4, #ARGV do size = size + string.len(ARGV[i]) end
if size > max_bytes then return -1 end
local known = redis.call('GET', KEYS[2])
redis.call('XADD', KEYS[1], '*', unpack(ARGV, 4))
local count = redis.call('XLEN', KEYS[1])
local total = size
if known and count > 1 then total = tonumber(known) + size end
if not known and count > 1 then
  redis.call('XTRIM', KEYS[1], 'MAXLEN', 1)
  count = 1
end
local drop, start = 0, '-'
while total > max_bytes or count - drop > max_len do
  local oldest = redis.call('XRANGE', KEYS[1], start, '+', 'COUNT', 1)
  if #oldest == 0 or drop == count - 1 then break end
  local fields = oldest[1][2]
  local bytes = overhead
  for i = 1, #fields do bytes = bytes + string.len(fields[i]) end
  total, drop, start = total - bytes, drop + 1, '(' .. oldest[1][1]
end
if drop > 0 then redis.call('XTRIM', KEYS[1], 'MAXLEN', count - drop) end
if total < size then total = size end
redis.call('SET', KEYS[2], total)
return total
"""
"""Appends the entry ARGV[4:] (field, value pairs) to stream KEYS[1], then trims the oldest
entries until at most ARGV[1] remain and their bytes (fields plus ARGV[3] each), kept in
KEYS[2], are at most ARGV[2]; returns those bytes (-1: the entry alone exceeds the cap, nothing
written). A stream whose count is missing (written before the byte cap, or its count deleted)
is trimmed to the new entry: its size is unknown. The new entry is never trimmed."""


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


def bytes_key(stream: str = STREAM) -> str:
    """The key counting the stream's bytes (in the stream's Redis Cluster slot: the hash tag
    is the stream's whole name)."""
    return f"{{{stream}}}:bytes"


async def append(client: redis.Redis, scope: str, prompt: list[int], output: list[int],
                 max_len: int = DEFAULT_STREAM_LEN, stream: str = STREAM,
                 max_bytes: int = DEFAULT_STREAM_BYTES) -> bool:
    """Add one finished generation, trimming the stream to ``max_len`` entries and ``max_bytes``
    (exactly: see APPEND_SCRIPT); False when the entry alone is over ``max_bytes`` (not kept)."""
    fields = [item for pair in encode(scope, prompt, output).items() for item in pair]
    stored = await client.eval(APPEND_SCRIPT, 2, stream, bytes_key(stream), max_len, max_bytes,
                               ENTRY_OVERHEAD_BYTES, *fields)
    return int(stored) >= 0


async def fit_to_maxmemory(client: redis.Redis, max_bytes: int) -> int:
    """``max_bytes``, or a MAXMEMORY_SHARE-th of Redis's ``maxmemory`` where that is smaller
    (``max_bytes`` when Redis sets none or will not say: CONFIG may be disabled)."""
    try:
        reply = await client.config_get("maxmemory")
        maxmemory = int(reply.get("maxmemory") or 0)
    except (RedisError, OSError, ValueError) as exc:
        log.info("speculation memory: cannot read Redis's maxmemory (%s); capping the stream "
                 "at %d bytes", exc, max_bytes)
        return max_bytes
    if maxmemory and maxmemory // MAXMEMORY_SHARE < max_bytes:
        log.warning("speculation memory: capping the stream at %d bytes, a quarter of Redis's "
                    "maxmemory (%d), not %d", maxmemory // MAXMEMORY_SHARE, maxmemory,
                    max_bytes)
        return maxmemory // MAXMEMORY_SHARE
    return max_bytes


FOLLOW_BLOCK_MS = 1000
"""How long one read of the stream waits for new entries: well inside the pods' Redis socket
timeout (``registry.connect``, 2 s), or an idle stream's every wait ends in a timeout error."""


class MemoryFeed:
    """Reads the stream from its start, then follows it, handing each batch of (scope,
    tokens) to ``index_batch`` in ``executor`` (off the event loop)."""

    def __init__(self, client: redis.Redis, index_batch: Callable[[list[tuple[str, list[int]]]],
                 None], executor=None, stream: str = STREAM, batch: int = 500,
                 block_ms: int = FOLLOW_BLOCK_MS, backoff_s: float = 1.0) -> None:
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
                replies: Any = await self.client.xread(  # [[stream, entries]] (RESP2)
                    {self.stream: self.last_id}, count=self.batch, block=self.block_ms)
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

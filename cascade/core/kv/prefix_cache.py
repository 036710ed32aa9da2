"""Prompt prefixes computed once per verifier: a new sequence whose context begins like a live
sequence's, or like one that ended a while ago, takes the blocks that hold those positions'
keys and values instead of feeding them again.

Two sources, the longer wins:

- **The cache of ended sequences** (``KVStore.register``). A sequence's full blocks of
  committed positions are registered as it goes and when it ends, each under a chained hash
  of its scope and every token up to the block's end
  (``cascade.protocol.prefix_keys``); a block nobody holds
  stays filled until the store needs it (least recently released first). The next turn of a
  chat, the next step of an agent loop and every request with a known system prompt start
  from there.
- **Live sequences of the scope** (the ``n`` choices of one prompt, sessions the scheduler
  holds back one step while another new one with the same prefix is prefilled): their full
  blocks are held by both, and a partly shared last block is copied (at least ``MIN_SHARED``
  positions).

A shared block is never written: whoever writes into it takes a copy first
(``PagedCache.feed``).

Exact: in the batch-invariant pass (the default) a position's keys and values are a function of
the tokens up to it alone, so the blocks taken are bit for bit what feeding those tokens would
write. In the plain pass they are what the pass that fed them wrote, which is one of the values
a pass of another shape may give (the plain pass promises no more).

What is taken: positions before the row's last one whose logits it needs (that one is always
fed). Rows that ask for hidden states of every position fed (a feature drafter's context) are
left alone. Not at all for models whose rotary frequencies depend on the row's length
(LongRoPE, dynamic NTK, ``row_rope.rope_switch``): a position's keys there depend on the length
of the pass that fed it.

Who shares: sequences of one *scope* only (``PagedCache.scope``: the gateway gives every
session its API key's identity, or one scope for all keys in a single-tenant deployment). The
scope is the root of every block's hash, so two keys sending the same prompt never find each
other's blocks: taking a prefix makes a prompt's first token come sooner, which would let one
key time guesses of another key's prompt.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING

from cascade.core.kv.kv_store import BLOCK_SIZE, KVStore
from cascade.core.kv.prefix_share import MIN_SHARED, longest_held
from cascade.protocol.prefix_keys import block_keys

if TYPE_CHECKING:  # for annotations only: the engine imports this module
    from cascade.core.verify.engine import Pass
    from cascade.core.verify.paged_cache import PagedCache


class PrefixCache:
    """The engine's live caches, and the prefixes new ones take (from them or the store)."""

    def __init__(self, store: KVStore, enabled: bool = True) -> None:
        self.store, self.enabled = store, enabled
        self._live: weakref.WeakSet[PagedCache] = weakref.WeakSet()
        self._lock = threading.Lock()
        """Caches join on the event loop (admission) and are read on the model thread."""
        self.queried_tokens = 0
        """Positions new sequences looked up (vLLM's prefix_cache_queries), since start."""
        self.shared_tokens = 0
        """Of those, positions taken instead of fed (vLLM's prefix_cache_hits)."""

    def add(self, cache: PagedCache) -> None:
        with self._lock:
            self._live.add(cache)

    def discard(self, cache: PagedCache) -> None:
        with self._lock:
            self._live.discard(cache)

    def live(self) -> list[PagedCache]:
        with self._lock:
            return list(self._live)

    def of_scope(self, scope: str) -> list[PagedCache]:
        """The live caches of ``scope`` (only those may give a new cache of it a prefix)."""
        return [cache for cache in self.live() if cache.scope == scope]

    def fill(self, passes: list[Pass]) -> None:
        """Before a step's rows are fed: give each row whose cache is still empty the longest
        prefix a live cache or the store holds."""
        if not self.enabled:
            return
        for p in passes:
            if p.cache.tokens or p.hidden_layers:
                continue
            limit = len(p.tokens) - p.num_leading - p.num_logits  # rows whose logits it needs
            self.queried_tokens += max(limit, 0)
            self.shared_tokens += self._take(p.cache, p.tokens, limit)

    def _take(self, cache: PagedCache, tokens: list[int], limit: int) -> int:
        keys = block_keys(tokens[:limit], cache.scope)
        cached = self._registered(keys)
        source, live = longest_held(self.of_scope(cache.scope), tokens, limit, cache)
        if live < MIN_SHARED or live <= len(cached) * BLOCK_SIZE:
            source, live = None, len(cached) * BLOCK_SIZE
        if not live:
            return 0
        cache.drop_blocks()
        blocks = cached if source is None else source.table.blocks[: live // BLOCK_SIZE]
        for block in blocks:
            self.store.hold(block)
        cache.table.blocks = list(blocks)
        cache.keys = keys[: len(blocks)]
        tail = live % BLOCK_SIZE if source is not None else 0
        if tail:
            copy = self.store.allocate(blocks[-1] if blocks else None)
            if copy is None:
                live -= tail
            else:
                self.store.copy_block(source.table.blocks[len(blocks)], copy, tail)
                cache.table.blocks.append(copy)
        cache.tokens = list(tokens[:live])
        return live

    def _registered(self, keys: list[bytes]) -> list[int]:
        """The registered blocks of the longest run of ``keys`` (a prefix's chained keys)."""
        blocks = []
        for key in keys:
            block = self.store.lookup(key)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def held(self, tokens: list[int], scope: str) -> int:
        """How long a prefix of ``tokens`` a live sequence of ``scope`` or the store holds now
        (everything when sharing is off: nothing is worth waiting for)."""
        if not self.enabled:
            return len(tokens)
        live = longest_held(self.of_scope(scope), tokens, len(tokens))[1]
        return max(live, len(self._registered(block_keys(tokens, scope))) * BLOCK_SIZE)

    def register(self, cache: PagedCache, end: int) -> None:
        """Register ``cache``'s full blocks of positions before ``end`` (final entries)."""
        if not self.enabled:
            return
        full = min(end, len(cache.tokens)) // BLOCK_SIZE
        if full <= len(cache.keys):
            return
        start = len(cache.keys)
        cache.keys += block_keys(cache.tokens[: full * BLOCK_SIZE], cache.scope, start,
                                 cache.keys[-1] if cache.keys else None)
        for block, key in zip(cache.table.blocks[start:full], cache.keys[start:]):
            self.store.register(block, key)

"""Prompt prefixes computed once per verifier: a new sequence whose context begins like a live
sequence's copies those positions' keys and values instead of feeding them again.

Where it pays: the ``n`` choices and ``best_of`` candidates of one prompt (the gateway sends a
prompt's sessions to the same pods, and the scheduler holds a new sequence back one step while
another new one with the same prefix is prefilled), and prompts that begin with the same
system prompt or chat template. A copy moves ``2 x layers x kv_heads x head_dim`` numbers per
position; feeding a position runs every layer's products on it.

Exact: in the batch-invariant pass (the default) a position's keys and values are a function of
the tokens up to it alone, so the copied entries are bit for bit what feeding them would have
written. In the plain pass they are what the source's pass wrote, which is one of the values a
pass of another shape may give (the plain pass promises no more).

The drafter's model caches (``SequenceCache``) do the same (``adopt_prefix``): a new session's
cache copies the prefix another session's cache on the pod holds before its first forward pass.

What is shared: positions the source holds now (its committed tokens; a step's rows are matched
before any row is fed, so nothing half-written is copied), up to the row's last position whose
logits it needs, which is always fed. Rows that ask for hidden states of every position fed (a
feature drafter's context) are left alone.

Not shared: models whose rotary frequencies depend on the row's length (LongRoPE, dynamic NTK,
``row_rope.rope_switch``): a position's keys there depend on the length of the pass that fed it,
so a copy could come from the other regime.

Who shares: caches of one *scope* only (``RegionCache.scope``, ``SequenceCache.scope``; the
gateway gives every session its API key's identity, or one scope for all keys in a
single-tenant deployment). A copy makes a prompt's first token come sooner, so sharing across
tenants would let one key time guesses of another key's live prompt.
"""

from __future__ import annotations

import threading
import weakref

import torch

# Annotations name the engine's ``Pass`` and ``RegionCache``, ``kv_store.KVStore`` and
# ``runner.SequenceCache`` without importing them: those modules import this one.

MIN_SHARED = 8
"""Shortest prefix worth copying (shorter ones are fed: the copy's fixed cost is not worth it)."""


class PrefixShare:
    """The live caches of one engine, and the copies of their prefixes into new ones."""

    def __init__(self, store: KVStore, enabled: bool = True) -> None:
        self.store, self.enabled = store, enabled
        self._live: weakref.WeakSet[RegionCache] = weakref.WeakSet()
        self._lock = threading.Lock()
        """Caches join on the event loop (admission) and are read on the model thread."""
        self.shared_tokens = 0
        """Positions copied instead of fed, since the engine started."""

    def add(self, cache: RegionCache) -> None:
        with self._lock:
            self._live.add(cache)

    def discard(self, cache: RegionCache) -> None:
        with self._lock:
            self._live.discard(cache)

    def of_scope(self, scope: str) -> list[RegionCache]:
        """The live caches of ``scope`` (only those may give a new cache of it a prefix)."""
        with self._lock:
            return [cache for cache in self._live if cache.scope == scope]

    def fill(self, passes: list[Pass]) -> None:
        """Before a step's rows are fed: give each row whose cache is still empty the longest
        prefix a live cache holds."""
        if not self.enabled:
            return
        for p in passes:
            if p.cache.tokens or p.hidden_layers:
                continue
            limit = len(p.tokens) - p.num_leading - p.num_logits  # rows whose logits it needs
            source, length = longest_held(self.of_scope(p.cache.scope), p.tokens, limit,
                                          p.cache)
            if source is not None and length >= MIN_SHARED:
                self.store.copy(source.region, p.cache.region, length)
                p.cache.tokens = list(p.tokens[:length])
                self.shared_tokens += length

    def held(self, tokens: list[int], scope: str) -> int:
        """How long a prefix of ``tokens`` a live sequence of ``scope`` holds now (everything
        when sharing is off: nothing is worth waiting for)."""
        if not self.enabled:
            return len(tokens)
        return longest_held(self.of_scope(scope), tokens, len(tokens))[1]


def longest_held(caches, tokens: list[int], limit: int, exclude=None) -> tuple[object, int]:
    """Of ``caches`` (each with the ``tokens`` it holds), the one holding the longest prefix of
    ``tokens[:limit]``, and that length (None, 0 when none holds any)."""
    best, length = None, 0
    for other in list(caches):
        held = other.tokens
        if other is exclude or not held or not tokens or held[0] != tokens[0]:
            continue
        shared = common_prefix_len(held, tokens[:limit])
        if shared > length:
            best, length = other, shared
    return best, length


def longest_common(context: list[int], others: list[list[int]]) -> int:
    """The longest prefix ``context`` shares with one of ``others``."""
    return max((common_prefix_len(context, other) for other in others), default=0)


def adopt_prefix(cache: SequenceCache, token_ids: list[int], limit: int) -> None:
    """Give an empty ``cache`` the longest prefix of ``token_ids[:limit]`` another live cache
    of its runner holds (at least MIN_SHARED positions; a copy of every layer's keys and
    values), as the verifier's engine does; none where a position's keys depend on the pass
    that fed it (``ModelRunner.rope_switch``)."""
    if cache.runner.rope_switch is not None:
        return
    caches = [other for other in list(cache.runner.live_caches) if other.scope == cache.scope]
    best, length = longest_held(caches, token_ids, limit, cache)
    layers = getattr(getattr(best, "cache", None), "layers", None)
    if length < MIN_SHARED or not layers or not all(
            torch.is_tensor(getattr(layer, "keys", None)) for layer in layers):
        return
    for i, layer in enumerate(layers):
        cache.cache.update(layer.keys[:, :, :length].clone(),
                           layer.values[:, :, :length].clone(), i)
    cache.tokens = list(token_ids[:length])
    cache.runner.shared_tokens += length


def common_prefix_len(a: list[int], b: list[int]) -> int:
    limit = min(len(a), len(b))
    for i in range(limit):
        if a[i] != b[i]:
            return i
    return limit

"""Prompt prefixes computed once on a drafter pod: a new sequence's model cache whose context
begins like a live cache's copies those positions' keys and values instead of feeding them
(``adopt_prefix``), and the helpers the verifier's prefix cache shares
(``cascade.core.kv.prefix_cache``: blocks of live and ended sequences).

Where it pays: the ``n`` choices and ``best_of`` candidates of one prompt (the gateway sends a
prompt's sessions to the same pods), and prompts that begin with the same system prompt or chat
template. A copy moves ``2 x layers x kv_heads x head_dim`` numbers per position; feeding a
position runs every layer's products on it.

Not shared: models whose rotary frequencies depend on the row's length (LongRoPE, dynamic NTK,
``row_rope.rope_switch``): a position's keys there depend on the length of the pass that fed it,
so a copy could come from the other regime.

Who shares: caches of one *scope* only (``SequenceCache.scope``; the gateway gives every
session its API key's identity, or one scope for all keys in a single-tenant deployment). A
copy makes a prompt's first token come sooner, so sharing across tenants would let one key time
guesses of another key's live prompt.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # for annotations only: the runner imports this module
    from cascade.core.model.runner import SequenceCache

MIN_SHARED = 8
"""Shortest prefix worth copying (shorter ones are fed: the copy's fixed cost is not worth it)."""
ENDED_BYTES = 128 << 20
"""Memory a model's caches of ended sequences may keep for later prefixes (``EndedCaches``)."""


@dataclass
class HeldTokens:
    """The tokens a ``SequenceCache`` holds, apart from it, so they outlive it."""

    tokens: list[int] = field(default_factory=list)


@dataclass
class Ended:
    """An ended sequence's cache, kept for prefixes of later ones."""

    scope: str
    tokens: list[int]
    cache: object
    """Its ``DynamicCache`` (every layer's keys and values; positions past ``tokens`` unused)."""


class EndedCaches:
    """The caches of a runner's ended sequences, least recently used first, up to
    ``max_positions`` positions in all."""

    def __init__(self, max_positions: int) -> None:
        self.max_positions = max_positions
        self._entries: OrderedDict[int, Ended] = OrderedDict()
        """id(entry) -> entry, least recently used first."""
        self._lock = threading.Lock()
        self.positions = 0

    def keep(self, scope: str, held: HeldTokens, cache) -> None:
        """A sequence ended (its ``SequenceCache`` was collected): keep what it held."""
        tokens = list(held.tokens)
        if len(tokens) < MIN_SHARED or not _has_tensors(cache):
            return
        entry = Ended(scope, tokens, cache)
        with self._lock:
            self._entries[id(entry)] = entry
            self.positions += len(tokens)
            while self.positions > self.max_positions and self._entries:
                _, oldest = self._entries.popitem(last=False)
                self.positions -= len(oldest.tokens)

    def of_scope(self, scope: str) -> list[Ended]:
        with self._lock:
            return [e for e in self._entries.values() if e.scope == scope]

    def touch(self, entry: Ended) -> None:
        """``entry`` gave a prefix: it is the last to go."""
        with self._lock:
            if id(entry) in self._entries:
                self._entries.move_to_end(id(entry))


def _has_tensors(cache) -> bool:
    layers = getattr(cache, "layers", None)
    return bool(layers) and all(torch.is_tensor(getattr(layer, "keys", None))
                                for layer in layers)


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
    of its runner, or an ended one it keeps (``EndedCaches``), holds (at least MIN_SHARED
    positions; a copy of every layer's keys and values), as the verifier's engine does; none
    where a position's keys depend on the pass that fed it (``ModelRunner.rope_switch``)."""
    runner = cache.runner
    if runner.rope_switch is not None:
        return
    caches = [other for other in list(runner.live_caches) if other.scope == cache.scope]
    best, length = longest_held(caches + runner.ended.of_scope(cache.scope), token_ids, limit,
                                cache)
    if length < MIN_SHARED or not _has_tensors(getattr(best, "cache", None)):
        return
    if isinstance(best, Ended):
        runner.ended.touch(best)
    layers = best.cache.layers
    for i, layer in enumerate(layers):
        cache.cache.update(layer.keys[:, :, :length].clone(),
                           layer.values[:, :, :length].clone(), i)
    cache.tokens = list(token_ids[:length])
    cache.runner.shared_tokens += length


def common_prefix_len(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share (list comparisons run in C: the usual
    case, one a prefix of the other, is one comparison; otherwise a binary search)."""
    limit = min(len(a), len(b))
    if a[:limit] == b[:limit]:
        return limit
    low, high = 0, limit - 1  # a[:low] == b[:low]; a[:high + 1] != b[:high + 1]
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low

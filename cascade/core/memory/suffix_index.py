"""The speculation memory's index: every finished generation a drafter pod was told of, searchable
by the suffix of a session's context (suffix decoding without a suffix tree).

Glossary:

- **sequence**: one finished generation, prompt and output ids, indexed under a **scope** (the
  tenant: an API key's digest, or one shared scope). A lookup sees only its own scope's sequences.
- **candidate**: a place in an indexed sequence whose preceding tokens match the end of the
  context. Its **match length** is how many tokens agree (at most ``max_depth``), its
  **continuation** the tokens that followed it (at most ``max_depth``).

A suffix tree over the sequences (what SuffixDecoding keeps) answers "which places end with the
context's last m tokens, and what followed them" for every m. Here the same answer comes from a
hashed *seed* index: each position is filed under a hash of the scope and the ``n`` tokens before
it, for each seed length n in ``SEEDS``; a lookup reads the most recent places filed under the
context's last n tokens, then measures each place's real match length by comparing tokens (so
hash collisions and other scopes' sequences are discarded, never proposed). The places of a
suffix-tree node for a match of m tokens are the candidates whose match length is at least m;
``cascade.core.memory.suffix_draft`` scores them as SuffixDecoding scores the node's subtree.

Memory is bounded: past ``max_sequences`` or ``max_tokens`` the oldest sequences are evicted
(first in, first out). The seed index is a sorted array searched by bisection (a lookup costs
O(log n), whatever the size) plus the latest entries, unsorted (a lookup scans them), merged
into the arrays in bulk. One writer (the pod's indexing thread) and any number of readers share
it under a lock; the expensive part of a merge runs outside the lock. What a lookup returns
(``Candidates``) and the lookup in a session's own context are ``cascade.core.memory.candidates``.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass

import numpy as np

from cascade.core.memory.candidates import (
    SEEDS,
    SEP,
    Candidates,
    MemoryLimits,
    candidates_at,
    gather,
    tail,
)

_PRIME = np.uint64(0x100000001B3)
_MERGE_EVERY = 1 << 16
"""Latest entries kept unsorted (a lookup scans them) before they are merged into the sorted
arrays."""


def scope_key(scope: str) -> np.uint64:
    """A scope's 64-bit tag (hashed, so the index never holds what a scope is called)."""
    return np.uint64(int.from_bytes(hashlib.blake2b(scope.encode(), digest_size=8).digest(),
                                    "little"))


def seed_hashes(tokens: np.ndarray, n: int, scope: np.uint64) -> np.ndarray:
    """[len(tokens) - n + 1] the hash of each n tokens (window i covers tokens[i:i+n]) under
    ``scope``: the key of the place right after the window."""
    with np.errstate(over="ignore"):
        h = np.full(len(tokens) - n + 1, scope, dtype=np.uint64)
        for j in range(n):
            h = h * _PRIME + tokens[j:len(tokens) - n + 1 + j].astype(np.uint64) + np.uint64(1)
    return h


class SuffixIndex:
    """Finished sequences of every scope, searchable by a context's suffix (see module)."""

    def __init__(self, limits: MemoryLimits = MemoryLimits()) -> None:
        self.limits = limits
        self._lock = threading.Lock()
        self._tokens = np.zeros(1024, np.int64)
        self._size = 0  # tokens written into _tokens
        self._base = 0  # global position of _tokens[0]
        self._live = 0  # global position below which sequences were evicted
        self._starts = np.zeros(1024, np.int64)  # each sequence's global start, oldest first
        self._scopes = np.zeros(1024, np.int64)  # and its scope's id
        self._scope_ids: dict[str, int] = {}
        self._num_seqs = 0  # sequences written into _starts
        self._first = 0  # index of the oldest live sequence
        self._keys = np.zeros(0, np.uint64)  # sorted seed keys
        self._places = np.zeros(0, np.int64)  # their global positions (ascending per key)
        self._recent_keys = np.zeros(_MERGE_EVERY, np.uint64)  # the latest entries, unsorted
        self._recent_places = np.zeros(_MERGE_EVERY, np.int64)
        self._num_recent = 0
        self.num_lookups = 0
        self.num_hits = 0
        """Lookups, and those that found at least one candidate (the pod's hit rate)."""

    @property
    def num_sequences(self) -> int:
        return self._num_seqs - self._first

    @property
    def num_tokens(self) -> int:
        """Tokens of the live sequences (their separators not counted)."""
        return self._base + self._size - self._live - self.num_sequences

    def add(self, tokens: list[int], scope: str) -> None:
        """Index one finished sequence (prompt and output ids) under ``scope``."""
        if len(tokens) < min(SEEDS) + 1:
            return
        seq = np.asarray(tokens, dtype=np.int64)[-self.limits.max_tokens:]
        key = scope_key(scope)
        with self._lock:
            start = self._append(seq)
            self._add_sequence(start, self._scope_ids.setdefault(scope, len(self._scope_ids)))
            for n in SEEDS:
                if len(seq) > n:
                    self._file(seed_hashes(seq[:-1], n, key), start + n)
            self._evict()
        if self._num_recent >= _MERGE_EVERY:
            self.merge()

    def _append(self, seq: np.ndarray) -> int:
        """Writes SEP + seq into the store; returns seq's global start."""
        need = self._size + len(seq) + 1
        if need > len(self._tokens):
            grown = np.zeros(max(need, 2 * len(self._tokens)), np.int64)
            grown[:self._size] = self._tokens[:self._size]
            self._tokens = grown
        self._tokens[self._size] = SEP
        self._tokens[self._size + 1:need] = seq
        start = self._base + self._size + 1
        self._size = need
        return start

    def _add_sequence(self, start: int, scope_id: int) -> None:
        if self._num_seqs == len(self._starts):
            self._starts = np.concatenate([self._starts, np.zeros_like(self._starts)])
            self._scopes = np.concatenate([self._scopes, np.zeros_like(self._scopes)])
        self._starts[self._num_seqs], self._scopes[self._num_seqs] = start, scope_id
        self._num_seqs += 1

    def _file(self, keys: np.ndarray, first_place: int) -> None:
        end = self._num_recent + len(keys)
        if end > len(self._recent_keys):
            grow = max(end, 2 * len(self._recent_keys)) - len(self._recent_keys)
            self._recent_keys = np.concatenate([self._recent_keys, np.zeros(grow, np.uint64)])
            self._recent_places = np.concatenate([self._recent_places,
                                                  np.zeros(grow, np.int64)])
        self._recent_keys[self._num_recent:end] = keys
        self._recent_places[self._num_recent:end] = np.arange(first_place,
                                                              first_place + len(keys))
        self._num_recent = end

    def _evict(self) -> None:
        limits = self.limits
        while (self.num_sequences > limits.max_sequences
               or (self.num_tokens > limits.max_tokens and self.num_sequences > 1)):
            self._first += 1
            self._live = (self._starts[self._first] - 1 if self._first < self._num_seqs
                          else self._base + self._size)
        dead = self._live - self._base
        if dead > self._size // 2 and dead > 4096:  # compact the store's dead front
            self._tokens = self._tokens[dead:].copy()
            self._size -= dead
            self._base = self._live
        if self._first > self._num_seqs // 2 and self._first > 1024:
            self._starts = self._starts[self._first:].copy()
            self._scopes = self._scopes[self._first:].copy()
            self._num_seqs -= self._first
            self._first = 0

    def merge(self) -> None:
        """Move the latest entries into the sorted arrays (and drop evicted ones). Only the
        writer calls it; readers keep using the old arrays until the swap."""
        with self._lock:
            num = self._num_recent
            new_keys = self._recent_keys[:num].copy()
            new_places = self._recent_places[:num].copy()
            keys, places, live = self._keys, self._places, self._live
        order = np.argsort(new_keys, kind="stable")
        new_keys, new_places = new_keys[order], new_places[order]
        alive = places >= live
        keys, places = keys[alive], places[alive]
        at = np.searchsorted(keys, new_keys, side="right")
        keys, places = np.insert(keys, at, new_keys), np.insert(places, at, new_places)
        with self._lock:
            self._keys, self._places = keys, places
            rest = self._num_recent - num  # filed while merging: kept for the next merge
            self._recent_keys[:rest] = self._recent_keys[num:self._num_recent]
            self._recent_places[:rest] = self._recent_places[num:self._num_recent]
            self._num_recent = rest

    def candidates(self, context: list[int] | np.ndarray, scope: str) -> Candidates:
        """Places in ``scope``'s sequences that match the end of ``context``, most recent
        first, at most ``max_candidates`` per seed."""
        depth, most = self.limits.max_depth, self.limits.max_candidates
        ctx = np.asarray(context, dtype=np.int64)
        key = scope_key(scope)
        with self._lock:
            scope_id = self._scope_ids.get(scope, -1)
            found = [self._places_of(int(seed_hashes(ctx[-n:], n, key)[0]), most)
                     for n in SEEDS if len(ctx) >= n]
            positions = np.unique(np.concatenate(found or [np.zeros(0, np.int64)]))[::-1]
            positions = self._in_scope(positions[positions >= self._live], scope_id)
            windows = gather(self._tokens[:self._size], self._base, positions, depth)
        found = candidates_at(windows, tail(ctx, depth), min(SEEDS))
        self.num_lookups += 1
        self.num_hits += found.num > 0
        return found

    def _places_of(self, key: int, most: int) -> np.ndarray:
        lo = np.searchsorted(self._keys, np.uint64(key), side="left")
        hi = np.searchsorted(self._keys, np.uint64(key), side="right")
        recent = self._recent_places[:self._num_recent][
            self._recent_keys[:self._num_recent] == np.uint64(key)][-most:]
        return np.concatenate([self._places[max(lo, hi - most):hi], recent])

    def _in_scope(self, positions: np.ndarray, scope_id: int) -> np.ndarray:
        """The positions that lie in sequences of the scope (compared exactly: a collision
        between two scopes' seed hashes must not hand one scope's text to another)."""
        if not len(positions):
            return positions
        starts = self._starts[self._first:self._num_seqs]
        scopes = self._scopes[self._first:self._num_seqs]
        owner = np.searchsorted(starts, positions, side="right") - 1
        return positions[(owner >= 0) & (scopes[np.maximum(owner, 0)] == scope_id)]


@dataclass(frozen=True)
class SessionMemory:
    """What one session may draft from: the pod's index, under the session's scope."""

    index: SuffixIndex
    scope: str

    def candidates(self, context: list[int] | np.ndarray) -> Candidates:
        return self.index.candidates(context, self.scope)

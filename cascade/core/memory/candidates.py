"""What a speculation-memory lookup returns (``Candidates``: places matching the end of a
context, their match lengths and continuations), the memory's limits, and the same lookup in a
session's own context (``context_candidates``). The index is ``cascade.core.memory.suffix_index``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SEP = -1
"""Separates sequences in the token store (and pads gathered windows): it matches no token."""
SEEDS = (2, 6)
"""Seed lengths: a place is found when at least this many tokens before it match the context
(the longer seed finds long matches that a common bigram's most recent places would miss)."""


@dataclass(frozen=True)
class MemoryLimits:
    max_sequences: int = 100_000
    """Sequences kept; the oldest is evicted past it."""
    max_tokens: int = 8_000_000
    """Tokens kept (prompts and outputs); the oldest sequences are evicted past it."""
    max_depth: int = 24
    """Longest match compared and longest continuation read (SuffixDecoding's tree depth)."""
    max_candidates: int = 256
    """Most recent places read per seed in a lookup."""

    def __post_init__(self) -> None:
        for name in ("max_sequences", "max_tokens", "max_depth", "max_candidates"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class Candidates:
    """Places that match the end of a context, the most recent first."""

    match_lens: np.ndarray
    """[M] int64 tokens that agree with the context's end (at least the smallest seed)."""
    continuations: np.ndarray
    """[M, L] int64 tokens that followed each place, SEP after its sequence ends."""

    @property
    def num(self) -> int:
        return len(self.match_lens)

    @staticmethod
    def none(depth: int) -> Candidates:
        return Candidates(np.zeros(0, np.int64), np.zeros((0, depth), np.int64))

    def __add__(self, other: Candidates) -> Candidates:
        return Candidates(np.concatenate([self.match_lens, other.match_lens]),
                          np.concatenate([self.continuations, other.continuations]))


def gather(store: np.ndarray, start: int, positions: np.ndarray, depth: int) -> np.ndarray:
    """[M, 2*depth] the ``depth`` tokens before and after each position of ``store`` (whose
    first element is at global position ``start``), SEP outside it."""
    idx = positions[:, None] - start + np.arange(-depth, depth)[None, :]
    inside = (idx >= 0) & (idx < len(store))
    return np.where(inside, store[np.clip(idx, 0, max(len(store) - 1, 0))], SEP)


def candidates_at(windows: np.ndarray, context_tail: np.ndarray, min_match: int) -> Candidates:
    """Match lengths and continuations of places whose ``windows`` (from ``gather``) were read;
    ``context_tail``: the context's last ``depth`` tokens (``tail``). Places that
    match fewer than ``min_match`` tokens (hash collisions) are dropped."""
    depth = windows.shape[1] // 2
    agree = (windows[:, :depth] == context_tail[None, :])[:, ::-1]  # [M, depth] nearest first
    match = agree.astype(np.int64).cumprod(axis=1).sum(axis=1)
    after = windows[:, depth:]
    ended = np.cumsum(after == SEP, axis=1) > 0
    after = np.where(ended, SEP, after)
    keep = match >= min_match
    return Candidates(match[keep], after[keep])


def tail(context: np.ndarray, depth: int) -> np.ndarray:
    """The last ``depth`` tokens of ``context``, padded on the left with a value that matches
    nothing (not even SEP: a context that starts where a sequence starts matches no further)."""
    padded = np.full(depth, SEP - 1, dtype=np.int64)
    n = min(depth, len(context))
    if n:
        padded[depth - n:] = context[len(context) - n:]
    return padded


def context_candidates(context: list[int] | np.ndarray, limits: MemoryLimits) -> Candidates:
    """Places in ``context`` itself that match its end (the session's own prompt and output so
    far), most recent first, at most ``max_candidates``."""
    ctx = np.asarray(context, dtype=np.int64)
    n, depth = min(SEEDS), limits.max_depth
    if len(ctx) <= n:
        return Candidates.none(depth)
    windows = np.lib.stride_tricks.sliding_window_view(ctx[:-1], n)  # window i: ctx[i:i+n]
    places = np.flatnonzero((windows == ctx[-n:]).all(axis=1)) + n
    places = places[::-1][:limits.max_candidates]
    return candidates_at(gather(ctx, 0, places, depth), tail(ctx, depth), n)

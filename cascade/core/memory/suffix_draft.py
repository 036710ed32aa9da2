"""Drafts from the speculation memory's candidates, scored as SuffixDecoding scores them.

The candidates whose match length is at least m are the places of a suffix-tree node for the
context's last m tokens; what followed them is the node's subtree, each child weighted by how
many places continue with it. A *path* follows the most frequent child at every step: its token's
probability is the product of the frequencies along the way (the share of places that continue
exactly so), and it stops once that falls below ``min_token_prob``. A *tree* keeps the most
probable nodes of the subtree instead (best first, so every kept node's parent is kept). A
draft's **score** is the sum of its tokens' probabilities: the tokens it expects to have
accepted. For every match length the draft may reach ``match_len * max_spec_factor +
max_spec_offset`` tokens (longer matches earn longer drafts); the highest score wins, a longer
match on ties.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cascade.core.memory.candidates import SEP, Candidates


@dataclass(frozen=True)
class SuffixParams:
    max_spec_factor: float = 1.0
    """Draft at most this many tokens per matched token (plus the offset)."""
    max_spec_offset: float = 0.0
    min_token_prob: float = 0.1
    """Stop (a path) or prune (a tree) where a token's probability falls below this."""


@dataclass(frozen=True)
class SuffixDraft:
    tokens: list[int]
    parents: list[int] | None
    """A tree's parent indices (-1: the root); None for a path."""
    probs: list[float]
    match_len: int

    @property
    def score(self) -> float:
        return float(sum(self.probs))

    @staticmethod
    def empty() -> SuffixDraft:
        return SuffixDraft([], None, [], 0)


def best_draft(found: Candidates, budget: int, params: SuffixParams = SuffixParams(),
               tree_nodes: int = 0) -> SuffixDraft:
    """The best-scoring path of at most ``budget`` tokens over every match length of
    ``found``; with ``tree_nodes``, the tree of at most that many nodes (depth at most
    ``budget``) grown under the winning match length."""
    best = SuffixDraft.empty()
    if budget <= 0:
        return best
    for match_len in sorted(set(found.match_lens.tolist()), reverse=True):
        rows = found.continuations[found.match_lens >= match_len,
                                   :_reach(match_len, budget, params)]
        tokens, probs = follow(rows, params.min_token_prob)
        if sum(probs) > best.score:
            best = SuffixDraft(tokens, None, probs, match_len)
    if tree_nodes and best.tokens:
        rows = found.continuations[found.match_lens >= best.match_len,
                                   :_reach(best.match_len, budget, params)]
        return grow_tree(rows, tree_nodes, params.min_token_prob, best.match_len)
    return best


def _reach(match_len: int, budget: int, params: SuffixParams) -> int:
    """How far a draft under a match of ``match_len`` tokens may reach."""
    return max(0, min(budget, math.floor(match_len * params.max_spec_factor
                                         + params.max_spec_offset)))


def follow(rows: np.ndarray, min_prob: float) -> tuple[list[int], list[float]]:
    """The most frequent continuation of ``rows`` ([S, L], SEP-padded, most recent first; ties
    go to the most recent) and each token's probability, until it falls below ``min_prob``."""
    tokens: list[int] = []
    probs: list[float] = []
    alive = np.ones(len(rows), dtype=bool)
    prob = 1.0
    for j in range(rows.shape[1]):
        column = rows[alive, j]
        drafted = column[column != SEP]
        if not len(drafted):
            break
        values, first, counts = np.unique(drafted, return_index=True, return_counts=True)
        pick = np.lexsort((first, -counts))[0]  # most frequent, then most recent
        prob *= counts[pick] / len(column)
        if prob < min_prob:
            break
        tokens.append(int(values[pick]))
        probs.append(float(prob))
        alive &= rows[:, j] == values[pick]
    return tokens, probs


def grow_tree(rows: np.ndarray, max_nodes: int, min_prob: float, match_len: int) -> SuffixDraft:
    """The ``max_nodes`` most probable nodes of the continuations' trie (a node's probability:
    the share of rows passing through it), at least ``min_prob``, parents first."""
    total = len(rows)
    node_of = np.full(total, -1, dtype=np.int64)  # each row's node at the current depth
    found: list[tuple[float, int, int, int, int]] = []  # (-prob, depth, recency, parent, token)
    for j in range(rows.shape[1]):
        on = (rows[:, j] != SEP) & (node_of != -2)  # -2: the row ended above
        if not on.any():
            break
        pairs = np.stack([node_of[on], rows[on, j]], axis=1)
        unique, first, inverse, counts = np.unique(pairs, axis=0, return_index=True,
                                                   return_inverse=True, return_counts=True)
        base = len(found)
        for (parent, token), at, count in zip(unique.tolist(), first.tolist(), counts.tolist()):
            found.append((-count / total, j, at, parent, token))
        new_node = np.full(total, -2, dtype=np.int64)
        new_node[on] = base + inverse.reshape(-1)
        node_of = new_node
    return _best_nodes(found, max_nodes, min_prob, match_len)


def _best_nodes(found: list[tuple[float, int, int, int, int]], max_nodes: int, min_prob: float,
                match_len: int) -> SuffixDraft:
    """Keep the most probable nodes (a parent is never less probable than its child, and wins
    ties by being shallower), then order them by depth and renumber their parents."""
    ranked = sorted((i for i, f in enumerate(found) if -f[0] >= min_prob),
                    key=lambda i: found[i][:3])[:max_nodes]
    ranked.sort(key=lambda i: (found[i][1], found[i][0], found[i][2]))
    index = {node: i for i, node in enumerate(ranked)}
    tokens = [found[i][4] for i in ranked]
    parents = [index[found[i][3]] if found[i][3] >= 0 else -1 for i in ranked]
    probs = [-found[i][0] for i in ranked]
    return SuffixDraft(tokens, parents, probs, match_len)

"""Prompt-lookup (n-gram) drafting: propose what followed the last occurrence of the current
suffix in the context. No model, no cost to speak of; it shines when the output copies from the
prompt (summaries, edits of code, quoting). Its blocks carry no q: at temperature > 0 they are
verified with q a point mass on each drafted token (still lossless). With ``tree_nodes`` it
proposes what followed every earlier occurrence of the suffix, merged into a token tree (a
trie: continuations that start alike share nodes), the most recent occurrence first."""

from __future__ import annotations

import numpy as np

from cascade.core.blocks import Draft
from cascade.core.proposers.base import Proposer
from cascade.core.proposers.hybrid import LookupThenModel


def ngram_propose(tokens: list[int], num_tokens: int, max_n: int = 4, min_n: int = 2) -> list[int]:
    """Up to ``num_tokens`` tokens that followed the most recent earlier occurrence of the
    longest suffix of ``tokens`` (length max_n down to min_n); [] when nothing matches."""
    continuations = ngram_continuations(tokens, num_tokens, max_n, min_n)
    return continuations[0] if continuations else []


def ngram_continuations(tokens: list[int], num_tokens: int, max_n: int = 4, min_n: int = 2
                        ) -> list[list[int]]:
    """What followed each earlier occurrence of the longest suffix of ``tokens`` that occurs
    (length max_n down to min_n), up to ``num_tokens`` tokens each, the most recent first."""
    if num_tokens <= 0:
        return []
    context = np.asarray(tokens, dtype=np.int64)
    for n in range(min(max_n, len(tokens) - 1), min_n - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(context[:-1], n)  # [L-n, n]
        hits = np.flatnonzero((windows == context[-n:]).all(axis=1))
        if hits.size:
            return [context[h + n : h + n + num_tokens].tolist() for h in hits[::-1]]
    return []


def trie(continuations: list[list[int]], max_nodes: int) -> tuple[list[int], list[int]]:
    """(tokens, parents) of the token tree holding the continuations (shared prefixes once),
    in order, until ``max_nodes`` nodes."""
    tokens: list[int] = []
    parents: list[int] = []
    child: dict[tuple[int, int], int] = {}
    for continuation in continuations:
        node = -1
        for token in continuation:
            if (node, token) not in child:
                if len(tokens) == max_nodes:
                    return tokens, parents
                child[node, token] = len(tokens)
                tokens.append(token)
                parents.append(node)
            node = child[node, token]
    return tokens, parents


class NgramProposer(Proposer):
    """Prompt lookup only; an empty draft when the suffix occurs nowhere earlier."""

    needs_model = False

    def propose(self, committed: list[int], num_tokens: int, stop=None) -> Draft:
        c = self.config
        if c.tree_nodes:
            nodes, depth = c.tree_shape(num_tokens, self.depth_left(committed))
            found = ngram_continuations(committed, depth, c.ngram_max_n, c.ngram_min_n)
            tokens, parents = trie(found, nodes)
            return Draft(tokens, parents=parents, source="ngram")
        return Draft(tokens=ngram_propose(committed, num_tokens, c.ngram_max_n, c.ngram_min_n),
                     source="ngram")


class NgramThenModelProposer(LookupThenModel):
    """Prompt lookup when it finds a match, else the drafter model."""

    lookup_class = NgramProposer

"""Token trees while the drafter drafts during verification (``drafter_service.speculation``).

Ranking a tree's outcomes. Building a tree feeds only its frontier nodes (a dynamic tree's
``branching`` per depth, a confidence tree's chain), so the logits after a leaf were never
computed. Ranking the outcomes (``cascade.core.plan.speculation.rank_outcomes``) needs the
distribution after every node, leaves included: one more pass feeds all the nodes at once,
each at position committed length + depth - 1 and seeing the committed tokens, its ancestors
and itself, like the verifier's pass over the block (the tree builder's grower,
``feed_tree``: batch-invariant in the invariant mode). The cache holds the committed tokens
again afterwards, the nodes kept aside by path.

Pre-drafting a tree for a guessed outcome: the verdict may arrive while it grows, and the tree
builders call their ``rank`` once per depth, so a ``rank`` that checks ``stop`` first stops the
pre-draft between depths (``stoppable``) without the builders knowing about verdicts.
"""

from __future__ import annotations

import torch

from cascade.core.proposers.base import DraftStopped
from cascade.core.model.tree_grower import ModelTreeGrower
from cascade.core.proposers.tree import Rank
from cascade.core.model.runner import SequenceCache


@torch.inference_mode()
def tree_logits(cache: SequenceCache, committed: list[int], tokens: list[int],
                parents: list[int]) -> torch.Tensor:
    """[len(tokens) + 1, vocab] float32: the logits after ``committed`` (row 0) and after each
    node (row i + 1). The nodes then wait in the cache by path (``SequenceCache.keep_grown``):
    the next context along one of them does not feed it again."""
    root = cache.forward_to(committed).logits[-1:]  # [1, vocab]
    if not tokens:
        return root
    with ModelTreeGrower(cache, len(committed)) as grower:
        return torch.cat([root, grower.feed_tree(tokens, parents)])


def stoppable(rank: Rank, stop) -> Rank:
    """``rank``, raising ``DraftStopped`` once ``stop()`` is true (None: ``rank`` itself)."""
    if stop is None:
        return rank

    def checked(logits: torch.Tensor, position: int) -> torch.Tensor:
        if stop():
            raise DraftStopped()
        return rank(logits, position)

    return checked

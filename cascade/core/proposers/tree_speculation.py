"""Token trees while the drafter drafts during verification (``drafter_service.speculation``).

Ranking a tree's outcomes. Building a tree feeds only its frontier nodes (a dynamic tree's ``branching`` per depth, a
confidence tree's chain), so the logits after a leaf were never computed. Ranking the outcomes
(``cascade.core.speculation.rank_outcomes``) needs the distribution after every node, leaves
included: one more pass feeds all the nodes at once, each at position committed length +
depth - 1 and seeing the committed tokens, its ancestors and itself (``ancestor_mask``), like
the verifier's pass over the block. The cache holds the committed tokens again afterwards.

Pre-drafting a tree for a guessed outcome: the verdict may arrive while it grows, and the tree
builders call their ``rank`` once per depth, so a ``rank`` that checks ``stop`` first stops the
pre-draft between depths (``stoppable``) without the builders knowing about verdicts.
"""

from __future__ import annotations

import torch

from cascade.core.proposers.base import DraftStopped
from cascade.core.proposers.tree import Rank
from cascade.core.runner import SequenceCache
from cascade.core.trees import ancestor_mask
from cascade.protocol.trees import depths


@torch.inference_mode()
def tree_logits(cache: SequenceCache, committed: list[int], tokens: list[int],
                parents: list[int]) -> torch.Tensor:
    """[len(tokens) + 1, vocab] float32: the logits after ``committed`` (row 0) and after each
    node (row i + 1)."""
    root = cache.forward_to(committed).logits[-1:]  # [1, vocab]
    if not tokens:
        return root
    base, count = len(committed), len(tokens)
    runner = cache.runner
    visible = torch.ones(count, base + count, dtype=torch.bool)  # [n, slots]
    visible[:, base:] = ancestor_mask(parents)
    dtype = next(runner.model.parameters()).dtype
    mask = torch.zeros(1, 1, count, base + count, dtype=dtype)  # additive: eager and sdpa
    mask.masked_fill_(~visible, torch.finfo(dtype).min)
    positions = torch.tensor([[base + d - 1 for d in depths(parents)]])  # [1, n]
    try:
        output = runner.forward(torch.tensor([tokens]), positions,
                                torch.arange(base, base + count), cache.cache,
                                attention_mask=mask)
    finally:
        excess = cache.cache.get_seq_length() - base  # the nodes, never in ``cache.tokens``
        if excess > 0:
            cache.cache.crop(-excess)
    return torch.cat([root, runner.target_logits(output.logits[0])])


def stoppable(rank: Rank, stop) -> Rank:
    """``rank``, raising ``DraftStopped`` once ``stop()`` is true (None: ``rank`` itself)."""
    if stop is None:
        return rank

    def checked(logits: torch.Tensor, position: int) -> torch.Tensor:
        if stop():
            raise DraftStopped()
        return rank(logits, position)

    return checked

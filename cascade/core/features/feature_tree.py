"""Token trees from a feature drafter: one depth's frontier nodes fed in one pass on its own
cache (the ``TreeGrower`` of ``cascade.core.proposers.tree``, which builds the tree).

A node's entry is what a chain's entry for its token would be on its path (``FeatureCache``:
entry t holds (feature, x_{t+1})): the feature is its parent's output a (a root child's: the
last committed entry's, as for a chain's first token: EAGLE's rule), the token its own, at
entry position committed length + depth - 2 (one before the token's: the model drafter's
position committed length + depth - 1 minus the feature drafter's shift), and it sees the
committed entries, its ancestors' and its own.
"""

from __future__ import annotations

import torch

from cascade.core.trees import FedSlots


class FeatureTreeGrower(FedSlots):
    """Feeds tree nodes into a feature drafter's cache (a ``FeatureCache``, which makes its
    grower with ``tree_grower``) after its ``base`` committed tokens (``base - 1`` entries);
    on exit (a context manager) it holds only those entries again."""

    def __init__(self, cache, base: int) -> None:
        super().__init__()
        self.cache = cache
        self.num_entries = len(cache.entry_tokens)
        """The committed context's entries (the tree's are appended after them)."""
        assert self.num_entries == base - 1 and len(cache.outputs), \
            "forward_to the committed tokens (two or more) first"

    def __enter__(self) -> FeatureTreeGrower:
        return self

    def __exit__(self, *exc) -> None:
        self.cache.truncate(self.num_entries)

    def feed(self, nodes, ids: list[int], depth: int) -> torch.Tensor:
        """One pass over one depth's ``nodes`` (candidate indices ``ids``); [F, vocab] logits."""
        count, parents = len(nodes), [node.parent for node in nodes]
        tree = self.place(ids, parents)  # [F, fed + F]
        visible = torch.cat([torch.ones(count, self.num_entries, dtype=torch.bool), tree], 1)
        rows = [self.num_entries + self.slot_of[p] if p >= 0 else self.num_entries - 1
                for p in parents]  # each parent's entry (the root's: the last committed one)
        positions = torch.full((count,), self.num_entries + depth - 1, dtype=torch.long)
        return self.cache.add_entries(self.cache.outputs[rows], [n.token for n in nodes],
                                      positions, visible)

"""How the model drafter grows a token tree in its own cache: each depth's frontier fed in one
pass after the committed tokens (``cascade.core.proposers.tree`` decides which nodes; a feature
drafter has its own grower, ``cascade.core.features.feature_tree``)."""

from __future__ import annotations

import torch

from cascade.core.model.runner import SequenceCache
from cascade.core.trees import FedSlots, TreeNode
from cascade.protocol.trees import depths


class ModelTreeGrower(FedSlots):
    """Feeds tree nodes into a sequence's drafter cache after its ``base`` committed tokens;
    on exit (a context manager) the cache holds the committed tokens again, the fed nodes kept
    aside by path (``SequenceCache.keep_grown``) until the next round's context keeps the
    accepted path's entries in place."""

    def __init__(self, cache: SequenceCache, base: int) -> None:
        super().__init__()
        self.cache, self.base = cache, base
        self.tokens: list[int] = []
        """Per fed slot: its token."""

    def __enter__(self) -> ModelTreeGrower:
        return self

    def __exit__(self, kind, *exc) -> None:
        paths = {tuple(self.tokens[s] for s in slots): slot
                 for slot, slots in enumerate(self.seen)}
        self.cache.keep_grown(paths if kind is None else {})

    def feed(self, nodes: list[TreeNode], ids: list[int], depth: int) -> torch.Tensor:
        """One pass over one depth's ``nodes`` (candidate indices ``ids``); [F, vocab] logits."""
        return self._feed([c.token for c in nodes], ids, [c.parent for c in nodes],
                          [self.base + depth - 1] * len(nodes))

    def feed_tree(self, tokens: list[int], parents: list[int]) -> torch.Tensor:
        """One pass over a whole tree (parents first; a fresh grower): [n, vocab] logits."""
        return self._feed(tokens, list(range(len(tokens))), parents,
                          [self.base + d - 1 for d in depths(parents)])

    def _feed(self, tokens: list[int], ids: list[int], parents: list[int],
              positions: list[int]) -> torch.Tensor:
        fed = len(self.seen)
        tree = self.place(ids, parents)  # [F, fed + F]
        self.tokens += tokens
        if self.cache.runner.invariant:
            return self._feed_invariant(fed, positions)
        return self._feed_masked(tree, positions)

    def _feed_masked(self, tree: torch.Tensor, positions: list[int]) -> torch.Tensor:
        """The plain pass: a 4D additive mask (eager and sdpa) shows each node the committed
        slots, its ancestors' and its own (``tree`` [F, fed + F]: the fed slots it sees)."""
        count, fed = tree.shape[0], tree.shape[1] - tree.shape[0]
        visible = torch.cat([torch.ones(count, self.base, dtype=torch.bool), tree], 1)
        runner = self.cache.runner
        dtype = next(runner.model.parameters()).dtype
        mask = torch.zeros(1, 1, *visible.shape, dtype=dtype)
        mask.masked_fill_(~visible, torch.finfo(dtype).min)
        start = self.base + fed
        output = runner.forward(torch.tensor([self.tokens[fed:]]), torch.tensor([positions]),
                                torch.arange(start, start + count), self.cache.cache,
                                attention_mask=mask)
        return runner.target_logits(output.logits[0])

    def _feed_invariant(self, fed: int, positions: list[int]) -> torch.Tensor:
        """The batch-invariant pass (``SequenceCache`` in the invariant mode): each node one
        row of the dense call, its slots the committed ones then its path's in position order,
        so a node's entries and logits are bit-equal to feeding its path as a chain; filler
        columns bring the pass to the model's row rule and are dropped after."""
        count = len(self.seen) - fed
        runner = self.cache.runner
        width = runner.invariance.linear.pad(count)
        start = self.base + fed
        committed = list(range(self.base))
        rows = [(committed + [self.base + s for s in slots], [(column, position)])
                for column, (slots, position) in enumerate(zip(self.seen[fed:], positions))]
        ids = torch.tensor([self.tokens[fed:] + [0] * (width - count)])
        padded = positions + positions[-1:] * (width - count)
        with runner.dense_call(rows, width, batches=[0] * count):
            output = runner.forward(ids, torch.tensor([padded]),
                                    torch.arange(start, start + width), self.cache.cache)
        if width > count:
            self.cache.cache.crop(count - width)
        return runner.target_logits(output.logits[0, :count])

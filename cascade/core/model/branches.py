"""Several continuations of one cached prefix, fed through the model as one batch.

Pre-drafting for guessed outcomes (``cascade.core.plan.speculation``) drafts a block after each of many
contexts that share the committed tokens and differ in a short tail. ``Branches`` copies the
prefix's KV cache once per row and feeds every row's next tokens in one forward pass: on a CPU a
step over 12 rows of a small drafter costs about two single-row steps. Rows may feed different
numbers of tokens per step; the shorter ones are padded, and the attention mask hides the padding
(each row's positions are its own), so every row computes what it would alone: exactly in the
runner's invariant mode (``ModelRunner.set_invariant``), up to float rounding otherwise.
"""

from __future__ import annotations

import copy
from contextlib import nullcontext

import torch

from cascade.core.model.runner import SequenceCache


class Branches:
    """Rows that continue the same cached prefix."""

    def __init__(self, cache: SequenceCache, prefix: list[int], num_rows: int) -> None:
        cache.hold(prefix)
        self.runner = cache.runner
        self.kv = copy.deepcopy(cache.cache)
        self.kv.batch_repeat_interleave(num_rows)
        self.lengths = [len(prefix)] * num_rows
        """Tokens each row holds (its next position)."""
        self.mask = torch.ones(num_rows, len(prefix), dtype=torch.long)  # [B, slots]

    @torch.inference_mode()
    def feed(self, rows: list[list[int]]) -> torch.Tensor:
        """Feed each row its tokens (possibly none); [B, vocab] float32 logits after each row's
        last token (a row fed nothing gets meaningless logits)."""
        width = max(1, max(len(r) for r in rows))
        if self.runner.invariant:  # padding columns until the rows suit the model's rule
            rule = self.runner.invariance.linear
            while rule.pad(len(rows) * width) != len(rows) * width:
                width += 1
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        valid = torch.zeros(len(rows), width, dtype=torch.long)
        for b, row in enumerate(rows):
            ids[b, : len(row)] = torch.tensor(row, dtype=torch.long)
            valid[b, : len(row)] = 1
        slots = self.mask.shape[1]
        self.mask = torch.cat([self.mask, valid], dim=1)
        positions = torch.tensor(self.lengths)[:, None] + torch.arange(width)[None]  # [B, S]
        with self._invariant(rows, width):
            output = self.runner.forward(ids, positions, torch.arange(slots, slots + width),
                                         self.kv, attention_mask=self.mask)
        last = torch.tensor([max(len(r), 1) - 1 for r in rows])
        self.lengths = [n + len(r) for n, r in zip(self.lengths, rows)]
        return self.runner.target_logits(output.logits[torch.arange(len(rows)), last])

    def _invariant(self, rows: list[list[int]], width: int):
        """The invariant forward's context: each row's own slots in position order and its
        real queries (``SequenceCache`` in the invariant mode), else nothing."""
        if not self.runner.invariant:
            return nullcontext()
        return self.runner.dense_call(
            [(torch.nonzero(self.mask[b]).flatten().tolist(),
              [(c, self.lengths[b] + c) for c in range(len(row))]) for b, row in enumerate(rows)],
            width)

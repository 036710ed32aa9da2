"""A packed step's rows grouped for attention: ``RowBatch``es of rows whose key spans are
alike, each attended by one call (``cascade.core.forward.packed``'s plain pass). A row's queries are
padded to the batch's widest row, its keys (a span of its slots) to the batch's longest span;
the mask hides the padding and what a query must not see (causal by slot, a sliding window in
positions, a tree node's non-ancestors)."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import TYPE_CHECKING

import torch

from cascade.core.forward import invariant
from cascade.core.trees import ancestor_mask

if TYPE_CHECKING:
    from cascade.core.forward.packed import Feed


@dataclass(frozen=True)
class RowBatch:
    """Rows attended by one SDPA call: each row's queries padded to ``width``, its keys (a
    span of its positions) padded to ``span``; ``mask`` hides the padding and what a row's query
    must not see."""

    rows: int
    span: int
    keys: torch.Tensor
    """[rows * span] store slots (padding repeats a row's first slot)."""
    first_slot: int | None
    """For one row whose keys are one run of slots (its blocks follow each other): the first
    (its keys are then a view of the store, no gather)."""
    queries: torch.Tensor
    """[rows * width] packed query indices (padding repeats a row's first query)."""
    real: torch.Tensor
    """Indices into rows * width of the real queries ..."""
    packed: torch.Tensor
    """... and their packed indices."""
    mask: torch.Tensor | None
    """[rows, 1, width, span] bool, True where a query sees a key; None: every key."""

    def gather(self, store: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """One layer's keys or values [kv_heads, capacity, d] -> [rows, kv_heads, span, d]."""
        if self.first_slot is not None:
            return store.narrow(1, self.first_slot, self.span).unsqueeze(0).to(dtype)
        picked = store.index_select(1, self.keys).view(store.shape[0], self.rows, self.span, -1)
        return picked.transpose(0, 1).to(dtype)


def batched_rows(feeds: list[Feed], window: int | None, device: torch.device
                 ) -> list[RowBatch]:
    """The step's rows grouped into ``RowBatch``es by key span (``invariant.span_groups``: one
    long row among short ones gets a call of its own rather than making every short row
    attend over its length)."""
    offsets = list(accumulate((len(f.tokens) for f in feeds), initial=0))
    spans = [f.length - _first_key(f, window) for f in feeds]
    return [_row_batch([feeds[i] for i in g], [offsets[i] for i in g], window, device)
            for g in invariant.span_groups(spans)]


def _first_key(feed: Feed, window: int | None) -> int:
    """The row's first slot any of its queries can see."""
    return 0 if window is None else max(0, feed.start - window + 1)


def _row_batch(feeds: list[Feed], offsets: list[int], window: int | None,
               device: torch.device) -> RowBatch:
    width = max(len(f.tokens) for f in feeds)
    firsts = [_first_key(f, window) for f in feeds]
    owns = [f.length - first for f, first in zip(feeds, firsts)]
    span = max(owns)
    keys, queries, real, packed = [], [], [], []
    for b, (feed, offset, first, own) in enumerate(zip(feeds, offsets, firsts, owns)):
        count = len(feed.tokens)
        slots = feed.table.slots(first, feed.length)
        keys += slots + slots[:1] * (span - own)
        queries += list(range(offset, offset + count)) + [offset] * (width - count)
        real += range(b * width, b * width + count)
        packed += range(offset, offset + count)
    mask = _batch_mask(feeds, window, owns, width, span)
    one = len(feeds) == 1
    full = one and width == len(feeds[0].tokens) and bool(mask.all())
    return RowBatch(len(feeds), span, torch.tensor(keys, device=device),
                    feeds[0].table.run_start(firsts[0], feeds[0].length) if one else None,
                    torch.tensor(queries, device=device), torch.tensor(real, device=device),
                    torch.tensor(packed, device=device), None if full else mask.to(device))


def _batch_mask(feeds: list[Feed], window: int | None, owns: list[int], width: int,
                span: int) -> torch.Tensor:
    """[rows, 1, width, span] bool: a row's real queries see its own keys (``_row_mask``
    narrows that where it must), a padding query sees one key (its output is dropped)."""
    counts = torch.tensor([len(f.tokens) for f in feeds])[:, None]  # [rows, 1]
    queries, keys = torch.arange(width)[None, :], torch.arange(span)[None, None, :]
    mask = (queries < counts)[..., None] & (keys < torch.tensor(owns)[:, None, None])
    mask[:, :, 0] |= queries >= counts
    for b, (feed, own) in enumerate(zip(feeds, owns)):
        row_mask = _row_mask(feed, window)
        if row_mask is not None:
            mask[b, : len(feed.tokens), :own] = row_mask
    return mask[:, None]


def _row_mask(feed: Feed, window: int | None) -> torch.Tensor | None:
    """[queries, keys] True where the row's query at slot start + i sees the key at slot
    first + j: causal by slot (the key rule of transformers' causal and sliding-window masks,
    the window counted in positions), and among tree nodes only ancestors and self; None when
    every key is seen."""
    start, length = feed.start, feed.length
    if length - start == 1:  # the keys were already cut to the one query's window
        return None
    first = 0 if window is None else max(0, start - window + 1)
    query_slots = torch.arange(start, length)[:, None]
    key_slots = torch.arange(first, length)[None, :]
    visible = key_slots <= query_slots
    if feed.parents:
        tree = feed.tree_start
        visible[tree - start:, tree - first:] = ancestor_mask(feed.parents)
    if window is not None:
        positions = torch.arange(first, length)
        positions[start - first:] = feed.positions()
        visible &= positions[None, :] > positions[start - first:, None] - window
    return visible

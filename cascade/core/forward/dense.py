"""The invariant attention inside a plain ``DynamicCache`` forward (a drafter's sequence, its
branches, a token tree's depth): per batch row, the cache slots holding its positions in order
and its real queries, planned into the same canonical attention groups as the packed pass
(``cascade.core.forward.invariant``)."""

from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from cascade.core.forward.invariant import KEY_BLOCK, Group, attend, key_span, planned, visible
from cascade.core.forward.row_rules import RowRule, padded


@dataclass
class DenseCall:
    """One forward over a ``DynamicCache`` batch (a drafter's sequence or its branches), for
    the invariant attention: per row, the cache slots holding its positions 0, 1, ... in
    order, and its real queries as (column, position)."""

    rows: list[tuple[list[int], list[tuple[int, int]]]]
    width: int
    """Query columns per batch row (real ones and padding)."""
    rule: RowRule
    pad_limit: int = 0
    """``Invariance.pad_limit``: groups of spans up to it may share a product."""
    batches: list[int] | None = None
    """The batch row each row's queries and slots are in; None: row i is batch row i. Rows
    that share a batch row see different slots: the nodes of a token tree, each its own
    ancestors."""
    plans: dict = field(default_factory=dict)


DENSE_CALL: ContextVar[DenseCall | None] = ContextVar("dense_call", default=None)


@contextmanager
def dense_call(call: DenseCall):
    """Forwards inside run ``call``'s invariant attention (``attend_dense``)."""
    token = DENSE_CALL.set(call)
    try:
        yield
    finally:
        DENSE_CALL.reset(token)


def attend_dense(call: DenseCall, query: torch.Tensor, keys: torch.Tensor,
                 values: torch.Tensor, scaling: float, window: int | None,
                 softcap: float | None) -> torch.Tensor:
    """query [B, heads, W, d], keys/values [B, kv_heads, L, d] (the cache after the update) ->
    [B, W, heads, d], every real query through the canonical attention (padding columns
    zero)."""
    batch, heads, width, dim = query.shape
    length = keys.shape[2]
    stride = padded(length + 1, KEY_BLOCK)  # a zero slot past every row's keys
    stride = max(stride, max((key_span(p, window)[1] for _, queries in call.rows
                              for _, p in queries), default=0) + KEY_BLOCK)
    key = (window, heads // keys.shape[1], stride)
    if key not in call.plans:
        call.plans[key] = _dense_plan(call, window, heads // keys.shape[1], stride, length,
                                      query.device)
    flat_keys = F.pad(keys, (0, 0, 0, stride - length)).transpose(0, 1).reshape(
        keys.shape[1], batch * stride, dim)
    flat_values = F.pad(values, (0, 0, 0, stride - length)).transpose(0, 1).reshape(
        keys.shape[1], batch * stride, dim)
    flat_query = query.transpose(0, 1).reshape(1, heads, batch * width, dim)
    out = attend(call.plans[key], flat_keys, flat_values, flat_query, scaling, softcap)
    return out[0].view(heads, batch, width, dim).permute(1, 2, 0, 3)


def _dense_plan(call: DenseCall, window, groups: int, stride: int, length: int, device):
    members: list[Group] = []
    for row, (slots, queries) in enumerate(call.rows):
        b = call.batches[row] if call.batches is not None else row
        sequence = [b * stride + s for s in slots]
        spans: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
        for column, position in queries:
            spans[key_span(position, window)].append((column, position))
        for (first, end), chosen in spans.items():
            full = sequence + [b * stride + length] * (end - len(sequence))
            group = Group([b * call.width + c for c, _ in chosen], full[first:end],
                          visible(torch.arange(first, end), [p for _, p in chosen], window))
            members.append(group)
    return planned(members, groups, call.rule, call.pad_limit, device)

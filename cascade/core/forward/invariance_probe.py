"""The start-up probe of a model's invariant pass on this machine: ``row_rules.probe``'s row
rules, and the longest key span the attention products may be padded to."""

from __future__ import annotations

from dataclasses import replace

import torch

from cascade.core.forward.invariant import KEY_BLOCK, canonical_attention
from cascade.core.forward.row_rules import Invariance, RowRule, probe
from cascade.core.kv.kv_store import attention_heads


def probe_invariance(model) -> Invariance:
    """``row_rules.probe``'s rules for ``model`` on this machine, with the span the attention
    products may be padded to (``span_pad_limit``; 0 where no rule was verified)."""
    found = probe(model)
    return replace(found, pad_limit=span_pad_limit(model, found.attention) if found.verified
                   else 0)


PAD_PROBE_LIMIT = 4096
"""The longest key span the start-up probe pads to."""


def span_pad_limit(model, rule: RowRule, seed: int = 0) -> int:
    """The longest span (whole key blocks, 0 for none) up to which ``canonical_attention``
    gives a query the same numbers over its key span alone and padded with masked key blocks
    (next to a group of another span), for this model's head sizes and query counts the rule
    gives (spans sampled for each length: one block, half of it, one block short of it):
    groups of spans up to it share one product (``buckets``). Past some length the products
    over keys block their reduction by the key count, so the limit is probed, not assumed."""
    heads, kv_heads, dim = attention_heads(model.config)
    generator = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    limit = KEY_BLOCK
    for padded_to in range(2 * KEY_BLOCK, PAD_PROBE_LIMIT + 1, KEY_BLOCK):
        spans = {KEY_BLOCK, padded_to // 2 // KEY_BLOCK * KEY_BLOCK, padded_to - KEY_BLOCK}
        if not all(_pads_alike(kv_heads, heads // kv_heads * rows, dim, span, padded_to,
                               generator, device)
                   for span in spans for rows in {rule.pad(1), rule.pad(5)}):
            break
        limit = padded_to
    return limit if limit > KEY_BLOCK else 0


def _pads_alike(kv_heads: int, rows: int, dim: int, span: int, padded_to: int,
                generator: torch.Generator, device: torch.device) -> bool:
    query = torch.randn(kv_heads, 2, rows, dim, generator=generator).to(device)
    keys = torch.randn(kv_heads, 2, padded_to, dim, generator=generator).to(device)
    values = torch.randn(kv_heads, 2, padded_to, dim, generator=generator).to(device)
    hidden = (torch.rand(1, 2, rows, padded_to, generator=generator) < 0.3).to(device)
    hidden[..., 0] = False
    hidden[:, 0, :, span:] = True  # the first group: span keys, padded
    for softcap in (None, 30.0):
        alone = canonical_attention(query[:, :1], keys[:, :1, :span], values[:, :1, :span],
                                    hidden[:, :1, :, :span], 0.125, softcap)
        padded = canonical_attention(query, keys, values, hidden, 0.125, softcap)
        if not torch.equal(padded[:, :1], alone):
            return False
    return True

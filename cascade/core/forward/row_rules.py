"""Row rules: how many rows a matrix product is given so that each row's numbers do not depend
on how many rows there are (``cascade.core.forward.invariant``), and the start-up probe that finds the
cheapest rule for a model on this machine."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from cascade.core.kv.kv_store import attention_heads

log = logging.getLogger(__name__)


def padded(count: int, multiple: int) -> int:
    return -(-count // multiple) * multiple


@dataclass(frozen=True)
class RowRule:
    """How many rows a product is given for ``count`` real ones (the rest are filler)."""

    multiple: int
    minimum: int

    def pad(self, count: int) -> int:
        return max(self.minimum, padded(count, self.multiple))


RULES = (RowRule(1, 1), RowRule(1, 2), RowRule(2, 2), RowRule(4, 4), RowRule(8, 8),
         RowRule(16, 16), RowRule(32, 32))
"""Candidate rules, cheapest first."""
_PROBE_COUNTS = (1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 16, 17, 33)


@dataclass(frozen=True)
class Invariance:
    """The rules the invariant pass runs with, probed for one model on this machine."""

    linear: RowRule
    """Tokens of the pass (every weight product, in the model's dtype)."""
    attention: RowRule
    """Queries of one attention group (the float32 products over keys)."""
    verified: bool
    """False when no candidate made the products invariant (the largest is used)."""
    pad_limit: int = 0
    """Key spans up to this length give a query the same numbers padded with masked key blocks
    up to it, so queries of different spans share one product (probed; 0: none)."""


@torch.inference_mode()
def probe(model, seed: int = 0) -> Invariance:
    """The cheapest rules under which every matrix product of ``model``'s pass gives each row
    the same numbers whatever the row count, probed here with the model's own weight shapes
    and the attention products, on the model's device."""
    generator = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    products = _distinct_weights(model)
    linear = next((rule for rule in RULES if all(
        _rows_invariant(product, width, dtype, _counts(rule), generator, device)
        for product, width, dtype in products)), None)
    attention = next((rule for rule in RULES
                      if _attention_invariant(model, rule, generator, device)), None)
    if linear is None or attention is None:
        log.warning("no row rule makes this model's matrix products row-invariant on this "
                    "machine: the batch-invariant pass is unverified")
    return Invariance(linear or RULES[-1], attention or RULES[-1],
                      linear is not None and attention is not None)


def _counts(rule: RowRule, groups: int = 1) -> list[int]:
    return sorted({groups * rule.pad(count) for count in _PROBE_COUNTS})


def _distinct_weights(model) -> list:
    """One product per distinct weight shape, as the model computes it: each ``nn.Linear``
    (x @ W.T) and transformers' ``Conv1D`` (GPT-2: x @ W) called as a module, so a packed one
    (``cascade.core.forward.packed_weights``) is probed as it runs."""
    from transformers.pytorch_utils import Conv1D

    seen, products = set(), []
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            width, out = module.in_features, module.out_features
        elif isinstance(module, Conv1D):
            width, out = module.nx, module.nf
        else:
            continue
        dtype = _weight_dtype(module)
        key = (type(module), width, out, dtype)
        if key not in seen:
            seen.add(key)
            products.append((module, width, dtype))
    return products


def _weight_dtype(module) -> torch.dtype:
    """The dtype of the module's product (a packed weight's, without unpacking it)."""
    packed = getattr(module, "packed", None)
    return packed.dtype if packed is not None else module.weight.dtype


def _rows_invariant(product, width: int, dtype: torch.dtype, counts: list[int],
                    generator: torch.Generator, device: torch.device | str = "cpu") -> bool:
    """Whether ``product`` gives the first and last rows of every row count in ``counts``
    (smallest first) the numbers a call with only the smallest count of rows gives them."""
    unit = counts[0]
    x = torch.randn(max(counts), width, generator=generator).to(device, dtype)
    head = product(x[:unit])
    for rows in counts[1:]:
        out = product(x[:rows])
        tail = product(x[rows - unit : rows])
        if not (torch.equal(out[:unit], head) and torch.equal(out[-unit:], tail)):
            return False
    return True


def _attention_invariant(model, rule: RowRule, generator: torch.Generator,
                         device: torch.device) -> bool:
    """The two attention products, in float32, for a few key spans and batch sizes."""
    heads, kv_heads, dim = attention_heads(model.config)
    counts = _counts(rule, heads // kv_heads)
    for span in (64, 256):
        keys = torch.randn(span, dim, generator=generator).to(device)
        if not (_rows_invariant(lambda x, k=keys: x @ k.T, dim, torch.float32, counts, generator,
                                device)
                and _rows_invariant(lambda x, k=keys: x @ k, span, torch.float32, counts,
                                    generator, device)
                and _batch_invariant(counts[0], dim, span, generator, device)):
            return False
    return True


def _batch_invariant(rows: int, dim: int, span: int, generator: torch.Generator,
                     device: torch.device) -> bool:
    """Whether a batched product gives each batch entry what a product of that entry alone
    gives (a bucket batches groups of different rows)."""
    for batch in (2, 5, 16):
        x = torch.randn(batch, rows, dim, generator=generator).to(device)
        y = torch.randn(batch, dim, span, generator=generator).to(device)
        full = x @ y
        if not all(torch.equal(full[b], (x[b : b + 1] @ y[b : b + 1])[0]) for b in range(batch)):
            return False
    return True

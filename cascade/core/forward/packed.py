"""One forward pass of a Hugging Face causal LM over many sequences' new tokens, packed.

The tokens every row feeds this step are concatenated into one ``[1, N]`` batch (no padding):
position ids carry each row's own positions, the linear layers see all N tokens at once, and
attention reads each row's blocks of the ``KVStore``. The last part plugs into transformers
through its public extension points:

- ``PackedStep.update`` stands where the model expects a cache: it writes the step's keys and
  values into the rows' blocks (one ``index_copy_`` per layer);
- ``packed_attention`` is registered as an attention implementation (``AttentionInterface``).
  In the plain pass the rows are gathered into one padded batch (``row_batches``: a row's
  queries against its span of keys, causal with the offset of the row's cached length, limited
  to the layer's sliding window when it has one, a tree node seeing its ancestors) and attended
  by one SDPA call per layer (soft-capped attention where the model asks for it); a row far
  longer than the others gets a call of its own rather than padding every row to its length.
  The batch-invariant pass attends by ``cascade.core.forward.invariant``'s fixed key spans. Called
  without a ``PackedStep`` (ordinary ``generate`` or a ``DynamicCache`` on the same model) it is
  plain SDPA (or the model's own eager attention for a model without SDPA support), with the
  masks transformers builds for that implementation;
- rotary embeddings whose frequencies depend on the sequence length (dynamic NTK, LongRoPE) are
  computed per row, from the row's own length, so a row's result never depends on the rows it
  is batched with.

The attention implementation itself, its registration and ``enable`` (which switches a model to
it, or refuses with the reason) are in ``cascade.core.forward.packed_backend``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from cascade.core.forward import invariant
from cascade.core.forward.graph_ops import STEP
from cascade.core.kv.kv_store import BlockTable, KVStore
from cascade.core.forward.row_rope import (ROWS)
from cascade.core.forward.row_rules import Invariance
from cascade.core.forward.row_batches import RowBatch, batched_rows
from cascade.protocol.trees import depths

_PREPARED_MASK = torch.ones(1, 1, 1, 1, dtype=torch.bool)
"""A 4D mask is taken as already prepared, so transformers builds none for a packed step
(``packed_attention`` ignores it and masks per row)."""
MIN_COMPILED_ROWS = 2
"""A compiled step feeds at least this many tokens (filler rows otherwise), so the token count
is never 1, a size compiled code would specialise on (two graphs whose kernels may round
differently)."""


@dataclass(frozen=True)
class Feed:
    """What one row feeds in a step: ``tokens`` into positions ``start ..`` of its block table.

    Without ``parents`` slot and position coincide. With them the last ``len(parents)`` tokens
    are the nodes of a token tree (``cascade.core.trees``) whose root is the token before them:
    node i sits at position root + depth(i) and sees the slots before the tree, its ancestors
    and itself."""

    table: BlockTable
    start: int
    tokens: list[int]
    parents: tuple[int, ...] | None = None

    @property
    def length(self) -> int:
        """Slots the row holds after the step."""
        return self.start + len(self.tokens)

    @property
    def tree_start(self) -> int:
        """The slot of the first tree node (``length`` without a tree)."""
        return self.length - len(self.parents or ())

    def positions(self) -> torch.Tensor:
        """[len(tokens)] the position of each fed token."""
        slots = torch.arange(self.start, self.length)
        if self.parents:
            tree = self.tree_start - 1 + torch.tensor(depths(self.parents))
            slots[self.tree_start - self.start:] = tree
        return slots


@dataclass(frozen=True)
class RowFeed:
    """A ``Feed`` as a message to a tensor-parallel target's other ranks carries it (its
    table's blocks rather than the table: ``cascade.core.parallel.ranks``)."""

    blocks: tuple[int, ...]
    start: int
    tokens: tuple[int, ...]
    parents: tuple[int, ...] | None


class PackedStep:
    """The step's rows, where the model's cache would be."""

    def __init__(self, store: KVStore, feeds: list[Feed], fill: int = 0,
                 invariance: Invariance | None = None) -> None:
        self.store, self.feeds, self.fill, self.invariance = store, feeds, fill, invariance
        self._mask_cache: dict[tuple, list] = {}
        """Per kind of layer: the rows' masks, or the invariant attention's plan."""
        slots = [slot for f in feeds for slot in f.table.slots(f.start, f.length)]
        self.slots = torch.tensor(slots, device=store.keys.device)  # [N] store slots written

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Where the model hands a cache its keys and values: they are written by ``attend``
        (one call per layer, so a compiled model sees one opaque operation)."""
        return keys, values

    def _write(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """keys, values: [1, kv_heads, N + fill, head_dim] for the packed tokens (filler rows
        write nothing), into the rows' slots (one ``index_copy_`` each)."""
        count = len(self.slots)
        self.store.keys[layer].index_copy_(1, self.slots,
                                           keys[0, :, :count].to(self.store.keys.dtype))
        self.store.values[layer].index_copy_(1, self.slots,
                                             values[0, :, :count].to(self.store.values.dtype))

    def _batches(self, window: int | None, device: torch.device) -> list[RowBatch]:
        """The rows as padded batches for one kind of layer (sliding or not), built once per
        step: ``batched_rows``."""
        key = (window, device)
        if key not in self._mask_cache:
            self._mask_cache[key] = batched_rows(self.feeds, window, device)
        return self._mask_cache[key]

    def attend(self, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, layer: int,
               scaling: float | None, window: int | None = None,
               softcap: float | None = None) -> torch.Tensor:
        """Write the step's ``keys`` and ``values`` of ``layer`` into the store, then attend:
        query: [1, heads, N + fill, head_dim] -> [1, N + fill, heads, head_dim] (filler rows
        get zeros). ``window``: a query at position q sees keys q - window + 1 .. q (None: all
        of 0 .. q)."""
        self._write(layer, keys, values)
        if self.invariance:
            outputs = self._attend_invariant(query, layer, scaling, window, softcap)
            if self.fill:
                outputs.append(query.new_zeros(*query.shape[:2], self.fill, query.shape[-1]))
            return torch.cat(outputs, dim=2).transpose(1, 2).contiguous()
        return self._attend_batched(query, layer, scaling, window, softcap)

    def _attend_invariant(self, query, layer, scaling, window, softcap) -> list[torch.Tensor]:
        """Every row through ``cascade.core.forward.invariant.attend`` (its plan built once per kind
        of layer); the filler rows are left out."""
        groups = query.shape[1] // self.store.keys.shape[1]
        key = ("invariant", window, groups)
        if key not in self._mask_cache:
            self._mask_cache[key] = invariant.plan(self.feeds, window, groups,
                                                   self.invariance.attention,
                                                   self.invariance.pad_limit, query.device)
        scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
        out = invariant.attend(self._mask_cache[key], self.store.keys[layer],
                               self.store.values[layer], query, scaling, softcap)
        return [out[:, :, : len(self.slots)]]

    def _attend_batched(self, query, layer, scaling, window, softcap) -> torch.Tensor:
        """The rows through SDPA (or soft-capped attention), one call per batch of rows
        (``batched_rows``: usually the whole step)."""
        heads, dim = query.shape[1], query.shape[-1]
        keys, values = self.store.keys[layer], self.store.values[layer]
        out = query.new_zeros(heads, query.shape[2], dim)
        for batch in self._batches(window, query.device):
            rows = query[0].index_select(1, batch.queries).view(heads, batch.rows, -1, dim)
            result = _row_attention(rows.transpose(0, 1), batch.gather(keys, rows.dtype),
                                    batch.gather(values, rows.dtype), batch.mask, scaling,
                                    softcap)  # [rows, heads, width, dim]
            result = result.transpose(0, 1).reshape(heads, -1, dim)
            out.index_copy_(1, batch.packed, result.index_select(1, batch.real))
        return out.transpose(0, 1)[None].contiguous()


def _row_attention(rows: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                   mask: torch.Tensor | None, scaling: float | None,
                   softcap: float | None) -> torch.Tensor:
    """rows: [1, heads, q, d]; keys, values: [1, kv_heads, k, d] -> [1, heads, q, d]."""
    if softcap is None:
        return F.scaled_dot_product_attention(rows, keys, values, attn_mask=mask, scale=scaling,
                                              enable_gqa=keys.shape[1] != rows.shape[1])
    return softcapped_attention(rows, keys, values, mask, scaling, softcap)


def softcapped_attention(rows: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                         mask: torch.Tensor | None, scaling: float | None,
                         softcap: float) -> torch.Tensor:
    """Attention with soft-capped logits (``tanh(s / cap) * cap``), in the order of Gemma-2's
    eager attention: scale, cap, mask, softmax in float32. Shapes as ``_row_attention``."""
    groups = rows.shape[1] // keys.shape[1]
    keys, values = keys.repeat_interleave(groups, 1), values.repeat_interleave(groups, 1)
    scaling = rows.shape[-1] ** -0.5 if scaling is None else scaling
    scores = torch.matmul(rows, keys.transpose(2, 3)) * scaling  # [1, heads, q, k]
    scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(rows.dtype)
    return torch.matmul(weights, values)


@torch.inference_mode()
def packed_forward(model, store: KVStore, feeds: list[Feed], keep: torch.Tensor,
                   hidden: bool = False, to_local: torch.Tensor | None = None,
                   invariance: Invariance | None = None):
    """Feed every row's tokens in one pass. ``keep``: [M] packed indices whose logits are
    wanted. Returns (logits [M, model vocab] float32, hidden states per layer [N, d] or ()).

    ``invariance``: the batch-invariant pass (``cascade.core.forward.invariant``): the tokens and the
    kept rows are padded with filler rows by its rule, and attention is canonical.

    A store with a ``mirror`` (a tensor-parallel target's rank 0) sends the pass to the other
    ranks first, which run it on their slices (``cascade.core.parallel.ranks``)."""
    with _mirrored(store, feeds, keep, hidden, to_local, invariance):
        return _packed_forward(model, store, feeds, keep, hidden, to_local, invariance)


def _mirrored(store: KVStore, feeds: list[Feed], keep: torch.Tensor, *args):
    if store.mirror is None:
        return contextlib.nullcontext()
    rows = [RowFeed(tuple(f.table.blocks), f.start, tuple(f.tokens), f.parents) for f in feeds]
    return store.changing("forward", rows, keep.tolist(), *args)  # a list pickles 200x faster


def _packed_forward(model, store: KVStore, feeds: list[Feed], keep: torch.Tensor,
                    hidden: bool, to_local: torch.Tensor | None,
                    invariance: Invariance | None):
    device = store.keys.device
    tokens = torch.tensor([t for f in feeds for t in f.tokens], dtype=torch.long)
    if to_local is not None:
        tokens = to_local[tokens]
    row_positions = [f.positions() for f in feeds]
    positions = torch.cat(row_positions)
    keep = keep.clone()  # made here, as every input is (one kind of tensor for compiled code)
    count, wanted = len(tokens), len(keep)
    forward = getattr(model, "cascade_compiled", None)  # cascade.core.verify.compiled
    least = MIN_COMPILED_ROWS if forward is not None else 1
    fill = _padded(count, invariance, least) - count
    if fill:
        tokens, positions = _filled(tokens, fill), _filled(positions, fill)
    if _padded(wanted, invariance, least) > wanted:
        keep = torch.cat([keep, keep[-1:].expand(_padded(wanted, invariance, least) - wanted)])
    step = PackedStep(store, feeds, fill, invariance)
    lengths = [(len(f.tokens), int(p.max()) + 1) for f, p in zip(feeds, row_positions)]
    rows, current = ROWS.set(tuple(lengths + ([(fill, 1)] if fill else []))), STEP.set(step)
    try:
        call = model if forward is None else forward
        output = call(input_ids=tokens[None].to(device),
                      position_ids=positions[None].to(device), cache=step,
                      attention_mask=_PREPARED_MASK, use_cache=True,
                      logits_to_keep=keep.to(device), output_hidden_states=hidden,
                      packed_step=step)
    finally:
        ROWS.reset(rows)
        STEP.reset(current)
    states = tuple(h[0, :count] for h in output.hidden_states) if hidden else ()
    return output.logits[0, :wanted].float(), states


def _padded(count: int, invariance: Invariance | None, least: int) -> int:
    """Rows a product is given for ``count`` real ones: the invariant pass's rule, and at
    least ``least``."""
    return max(least, invariance.linear.pad(count) if invariance else count)


def _filled(values: torch.Tensor, fill: int) -> torch.Tensor:
    """``values`` and ``fill`` zeros (filler rows: token 0 at position 0)."""
    return torch.cat([values, values.new_zeros(fill)])

"""One forward pass of a Hugging Face causal LM over many sequences' new tokens, packed.

The tokens every row feeds this step are concatenated into one ``[1, N]`` batch (no padding):
position ids carry each row's own positions, the linear layers see all N tokens at once, and
attention runs per row against that row's region of the ``KVStore``. The last part plugs into
transformers through its public extension points:

- ``PackedStep.update`` stands where the model expects a cache: it writes the step's keys and
  values into the rows' regions (one ``index_copy_`` per layer);
- ``packed_attention`` is registered as an attention implementation (``AttentionInterface``):
  for each row it calls ``scaled_dot_product_attention`` on the row's queries and a view of the
  row's cached keys and values, with the causal mask offset by the row's cached length. Called
  without a ``PackedStep`` (ordinary ``generate`` or a ``DynamicCache`` on the same model) it is
  plain SDPA, and masks are built exactly as for SDPA.

A model switched to this implementation keeps working everywhere else, so one loaded target can
serve the engine and the per-sequence runner alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from cascade.core.kv_store import KVStore, Region

ATTENTION = "cascade_packed"
_PREPARED_MASK = torch.ones(1, 1, 1, 1, dtype=torch.bool)
"""A 4D mask is taken as already prepared, so transformers builds none for a packed step
(``packed_attention`` ignores it and masks per row)."""


@dataclass(frozen=True)
class Feed:
    """What one row feeds in a step: ``tokens`` at positions ``start ..`` of its sequence."""

    region: Region
    start: int
    tokens: list[int]


class PackedStep:
    """The step's rows, where the model's cache would be."""

    def __init__(self, store: KVStore, feeds: list[Feed]) -> None:
        self.store, self.feeds = store, feeds
        slots = [torch.arange(f.region.start + f.start, f.region.start + f.start + len(f.tokens))
                 for f in feeds]
        self.slots = torch.cat(slots).to(store.keys.device)  # [N] store positions written

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int, *args, **kwargs):
        """keys, values: [1, kv_heads, N, head_dim] for the packed tokens."""
        self.store.keys[layer_idx].index_copy_(1, self.slots, keys[0].to(self.store.keys.dtype))
        self.store.values[layer_idx].index_copy_(1, self.slots,
                                                 values[0].to(self.store.values.dtype))
        return keys, values

    def attend(self, query: torch.Tensor, layer: int, scaling: float | None) -> torch.Tensor:
        """query: [1, heads, N, head_dim] -> [1, N, heads, head_dim]."""
        outputs, offset = [], 0
        for feed in self.feeds:
            count, length = len(feed.tokens), feed.start + len(feed.tokens)
            span = slice(feed.region.start, feed.region.start + length)
            keys = self.store.keys[layer, :, span].unsqueeze(0)  # views of the store
            values = self.store.values[layer, :, span].unsqueeze(0)
            rows = query[:, :, offset : offset + count]
            mask = None
            if count > 1:  # query i sits at position start + i and sees keys 0 .. start + i
                mask = (torch.arange(length, device=query.device)[None, :]
                        <= torch.arange(feed.start, length, device=query.device)[:, None])
            outputs.append(F.scaled_dot_product_attention(
                rows, keys.to(rows.dtype), values.to(rows.dtype), attn_mask=mask,
                scale=scaling, enable_gqa=keys.shape[1] != rows.shape[1]))
            offset += count
        return torch.cat(outputs, dim=2).transpose(1, 2).contiguous()


def packed_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                     **kwargs):
    step = kwargs.get("packed_step")
    if step is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      scaling=scaling, dropout=dropout, **kwargs)
    return step.attend(query, module.layer_idx, scaling), None


AttentionInterface.register(ATTENTION, packed_attention)
AttentionMaskInterface.register(ATTENTION, sdpa_mask)


def enable(model) -> None:
    """Switch ``model`` to packed attention (idempotent; SDPA behaviour otherwise)."""
    if model.config._attn_implementation != ATTENTION:
        model.set_attn_implementation(ATTENTION)


@torch.inference_mode()
def packed_forward(model, store: KVStore, feeds: list[Feed], keep: torch.Tensor,
                   hidden: bool = False, to_local: torch.Tensor | None = None):
    """Feed every row's tokens in one pass. ``keep``: [M] packed indices whose logits are
    wanted. Returns (logits [M, model vocab] float32, hidden states per layer [N, d] or ())."""
    device = store.keys.device
    tokens = torch.tensor([t for f in feeds for t in f.tokens], dtype=torch.long)
    if to_local is not None:
        tokens = to_local[tokens]
    positions = torch.cat([torch.arange(f.start, f.start + len(f.tokens)) for f in feeds])
    step = PackedStep(store, feeds)
    output = model(input_ids=tokens[None].to(device), position_ids=positions[None].to(device),
                   past_key_values=step, attention_mask=_PREPARED_MASK, use_cache=True,
                   logits_to_keep=keep.to(device), output_hidden_states=hidden,
                   packed_step=step)
    states = tuple(h[0] for h in output.hidden_states) if hidden else ()
    return output.logits[0].float(), states

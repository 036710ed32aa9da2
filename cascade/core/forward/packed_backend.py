"""The packed attention as a transformers attention implementation: registered with
``AttentionInterface`` under ``ATTENTION`` (and ``ATTENTION_EAGER`` for models without SDPA
support), it attends a ``PackedStep``'s rows (``cascade.core.forward.packed``), a dense invariant
call's rows (``cascade.core.forward.dense``), or plainly outside both.

A model switched to this implementation keeps working everywhere else, so one loaded target can
serve the engine and the per-sequence runner alike. ``enable`` refuses, with the reason, a model
whose attention needs something the packed pass does not implement (attention sinks, chunked or
bidirectional attention, linear-attention layers, attention outside ``AttentionInterface``).
"""

from __future__ import annotations

import sys

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask

from cascade.core.forward import dense
from cascade.core.forward.graph_ops import packed_attention as packed_attention_op
from cascade.core.forward.row_rope import (config_rope_types, has_length_dependent_rope,
                                           is_length_dependent, per_row_rotary)

ATTENTION = "cascade_packed"
ATTENTION_EAGER = "cascade_packed_eager"
"""The same packed attention for models without SDPA support (e.g. Gemma-2's soft-capping):
outside a packed step it runs the model's own eager attention, with eager (additive) masks."""
_SUPPORTED_LAYER_TYPES = {"full_attention", "sliding_attention"}
_UNSUPPORTED_KWARGS = {"s_aux": "attention sinks", "sinks": "attention sinks",
                       "position_bias": "an attention position bias"}


class UnsupportedModel(ValueError):
    """The model's attention needs something the packed pass does not implement."""


def _refuse_unsupported(module, kwargs: dict) -> None:
    for name, feature in _UNSUPPORTED_KWARGS.items():
        if kwargs.get(name) is not None:
            raise UnsupportedModel(f"{type(module).__name__} passes {name!r} ({feature}), "
                                   f"which packed attention does not implement")


def _attend_packed(module, query, key, value, scaling, kwargs):
    _refuse_unsupported(module, kwargs)
    args = (module.layer_idx, scaling, kwargs.get("sliding_window"), kwargs.get("softcap"))
    if torch.compiler.is_compiling():
        return packed_attention_op(query, key, value, *args), None
    return kwargs["packed_step"].attend(query, key, value, *args), None


def _attend_dense(module, query, key, value, scaling, kwargs):
    """A ``DynamicCache`` forward in the invariant mode (``SequenceCache``, ``Branches``)."""
    _refuse_unsupported(module, kwargs)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    return dense.attend_dense(dense.DENSE_CALL.get(), query, key, value, scaling,
                                  kwargs.get("sliding_window"), kwargs.get("softcap")), None


def packed_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                     **kwargs):
    if kwargs.get("packed_step") is not None:
        return _attend_packed(module, query, key, value, scaling, kwargs)
    if dense.DENSE_CALL.get() is not None:
        return _attend_dense(module, query, key, value, scaling, kwargs)
    _refuse_unsupported(module, kwargs)
    return sdpa_attention_forward(module, query, key, value, attention_mask,
                                  scaling=scaling, dropout=dropout, **kwargs)


def packed_eager_attention(module, query, key, value, attention_mask, scaling=None,
                           dropout=0.0, **kwargs):
    if kwargs.get("packed_step") is not None:
        return _attend_packed(module, query, key, value, scaling, kwargs)
    if dense.DENSE_CALL.get() is not None:
        return _attend_dense(module, query, key, value, scaling, kwargs)
    _refuse_unsupported(module, kwargs)
    eager = sys.modules[type(module).__module__].eager_attention_forward
    return eager(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                 **kwargs)


AttentionInterface.register(ATTENTION, packed_attention)
AttentionMaskInterface.register(ATTENTION, sdpa_mask)
AttentionInterface.register(ATTENTION_EAGER, packed_eager_attention)
AttentionMaskInterface.register(ATTENTION_EAGER, eager_mask)


def unsupported_reason(model) -> str | None:
    """Why the packed pass cannot run ``model`` exactly, or None when it can."""
    config = model.config
    if not type(model)._supports_attention_backend:
        return "its attention does not go through transformers' AttentionInterface"
    layer_types = set(getattr(config, "layer_types", None) or ()) - _SUPPORTED_LAYER_TYPES
    if layer_types:
        return (f"it has {sorted(layer_types)} layers (packed attention implements "
                f"{sorted(_SUPPORTED_LAYER_TYPES)})")
    if getattr(config, "attention_chunk_size", None):
        return "it uses chunked attention (attention_chunk_size)"
    if getattr(config, "use_bidirectional_attention", False):
        return "it uses bidirectional attention (use_bidirectional_attention)"
    if any(hasattr(m, "sinks") for m in model.modules()):
        return "its attention has sinks"
    dependent = sorted(t for t in config_rope_types(config) if is_length_dependent(t))
    if dependent and not any(has_length_dependent_rope(m) for m in model.modules()):
        return (f"its rope ({dependent}) depends on the sequence length and has no rotary "
                f"module that can be computed per row")
    if not getattr(model, "_supports_sdpa", True) and not hasattr(
            sys.modules[type(model).__module__], "eager_attention_forward"):
        return "it supports neither SDPA nor a module-level eager attention"
    return None


def enable(model) -> None:
    """Switch ``model`` to packed attention (idempotent; its own attention otherwise), or
    raise ``UnsupportedModel`` naming the model type and the reason."""
    if model.config._attn_implementation in (ATTENTION, ATTENTION_EAGER):
        return
    reason = unsupported_reason(model)
    if reason is not None:
        raise UnsupportedModel(f"model type {model.config.model_type!r} cannot be served by "
                               f"the packed verifier: {reason}")
    model.set_attn_implementation(ATTENTION if getattr(model, "_supports_sdpa", True)
                                  else ATTENTION_EAGER)
    for module in model.modules():
        if has_length_dependent_rope(module):
            module.register_forward_hook(per_row_rotary, with_kwargs=True)

"""Rotary embeddings whose frequencies depend on the sequence length (dynamic NTK, LongRoPE),
computed per row inside a packed pass (``cascade.core.forward.packed``): transformers recomputes them
from the longest position of the whole batch, so a row's result would depend on the rows it is
batched with; here each row gets the frequencies of its own length."""

from __future__ import annotations

from contextvars import ContextVar

import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

ROWS: ContextVar[tuple[tuple[int, int], ...] | None] = ContextVar("packed_rows", default=None)
"""During a packed pass: (tokens fed, sequence length after the step) per row, in order."""


def rope_switch(model) -> int | None:
    """For a model whose rotary frequencies depend on the row's length (LongRoPE, dynamic NTK):
    the longest row of the first regime (its original positions), so a position's keys depend
    on the pass that fed it; None for any other model."""
    config = model.config
    if not any(is_length_dependent(t) for t in config_rope_types(config)):
        return None
    params = getattr(config, "rope_parameters", None) or {}
    return (params.get("original_max_position_embeddings")
            or getattr(config, "original_max_position_embeddings", None)
            or config.max_position_embeddings)


def is_length_dependent(rope_type: str) -> bool:
    """The rope types whose frequencies transformers recomputes from the longest position."""
    return "dynamic" in rope_type or rope_type == "longrope"


def config_rope_types(config) -> set[str]:
    params = getattr(config, "rope_parameters", None) or {}
    per_layer_type = [p for p in params.values() if isinstance(p, dict)]
    return {p.get("rope_type", "default") for p in per_layer_type or [params]}


def has_length_dependent_rope(module) -> bool:
    rope_type = getattr(module, "rope_type", None)
    types = rope_type.values() if isinstance(rope_type, dict) else [rope_type]
    return (hasattr(type(module).forward, "__wrapped__")
            and any(isinstance(t, str) and is_length_dependent(t) for t in types))


def per_row_rotary(module, args, kwargs, output):
    """Forward hook on a rotary embedding: inside a packed pass, recompute (cos, sin) row by
    row, each from its own sequence length (transformers' update looks at the whole batch)."""
    rows = ROWS.get()
    if rows is None:
        return None
    bound = dict(zip(("x", "position_ids", "layer_type"), args)) | kwargs
    x, positions, layer_type = bound["x"], bound["position_ids"], bound.get("layer_type")
    parts, offset = [], 0
    for count, length in rows:
        span = slice(offset, offset + count)
        parts.append(_rotary_row(module, x[:, span], positions[..., span], layer_type, length))
        offset += count
    return tuple(torch.cat(chunks, dim=-2) for chunks in zip(*parts))


def _rotary_row(module, x, positions, layer_type, length):
    """(cos, sin) for one row [1, count, dim], with the frequencies transformers uses for a
    sequence of ``length`` positions (computed afresh: its dynamic update keeps state)."""
    rope_type = module.rope_type if layer_type is None else module.rope_type[layer_type]
    extra = {} if layer_type is None else {"layer_type": layer_type}
    forward = type(module).forward.__wrapped__  # without transformers' batch-wide update
    if not is_length_dependent(rope_type):
        return forward(module, x, positions, **extra)
    name = "inv_freq" if layer_type is None else f"{layer_type}_inv_freq"
    inv_freq, _ = ROPE_INIT_FUNCTIONS[rope_type](module.config, x.device, seq_len=length,
                                                 **extra)
    saved = getattr(module, name)
    setattr(module, name, inv_freq.to(saved.dtype))
    try:
        return forward(module, x, positions, **extra)
    finally:
        setattr(module, name, saved)

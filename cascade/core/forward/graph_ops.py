"""The engine's own operations as ``torch.library`` custom ops, so a compiled model step
(``cascade.core.verify.compiled``) calls them as single opaque nodes rather than tracing into them:

- ``cascade::packed_attention``: one layer's packed attention (``PackedStep.attend``: the step's
  keys and values written into the rows' blocks, then every row attended), the step itself
  read from ``STEP`` (set around the model call by ``packed_forward``), since a plan of Python
  objects cannot be an operator's argument;
- ``cascade::packed_linear``: a product over a oneDNN-packed weight
  (``cascade.core.forward.packed_weights``), which inductor would otherwise lower only for weights it
  froze itself.

Eager code calls the same functions directly; only code being compiled goes through the ops
(``torch.compiler.is_compiling``), so both run the very same kernels.
"""

from __future__ import annotations

import contextvars

import torch

STEP: contextvars.ContextVar = contextvars.ContextVar("cascade_packed_step", default=None)
"""The ``PackedStep`` of the model call in progress."""


def is_compiled(model) -> bool:
    """Whether ``model``'s packed passes run compiled (``cascade.core.verify.compiled``)."""
    return getattr(model, "cascade_compiled", None) is not None


@torch.library.custom_op("cascade::packed_attention", mutates_args=())
def packed_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, layer: int,
                     scaling: float | None, window: int | None,
                     softcap: float | None) -> torch.Tensor:
    """``STEP``'s attention of ``layer``: [1, heads, N, d] -> [1, N, heads, d]."""
    return STEP.get().attend(query, keys, values, layer, scaling, window, softcap)


@packed_attention.register_fake
def _(query, keys, values, layer, scaling, window, softcap):
    batch, heads, tokens, dim = query.shape
    return query.new_empty(batch, tokens, heads, dim)


@torch.library.custom_op("cascade::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor, packed: torch.Tensor,
                  bias: torch.Tensor | None) -> torch.Tensor:
    """x @ W.T (+ bias) for W packed by ``torch.ops.mkldnn._reorder_linear_weight``."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@packed_linear.register_fake
def _(x, packed, bias):
    return x.new_empty(*x.shape[:-1], packed.shape[0])

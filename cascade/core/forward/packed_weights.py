"""Weight products on the CPU through oneDNN, with each weight packed once at load.

``torch.nn.functional.linear`` on the CPU hands a product to MKL, which picks its kernel by the
row count: a vector kernel for one row, small-matrix kernels below 16 rows, blocked kernels
above. Each gives a row different bits, so the batch-invariant pass (``cascade.core.forward.invariant``)
had to pad every product to 16 rows in float32, paying a 16-row product for a one-token decode
step (2.5x the vector kernel), and MKL re-packs the weight on every call besides.

oneDNN's matrix product over a weight reordered once into its blocked layout
(``torch.ops.mkldnn._reorder_linear_weight``, the layout ``torch.compile``'s CPU freezing uses)
computes every row of a product of two or more rows alike whatever the row count (measured by
``cascade.core.forward.row_rules.probe`` at start-up, as before), costs about what the vector kernel
costs at one or two rows, and in bfloat16 takes the hardware's bfloat16 dot products. ``pack``
swaps a model's ``nn.Linear`` (and GPT-2's ``Conv1D``) modules, in place, for ones that call it.

Memory: a packed module keeps only the packed weight; ``weight`` still reads (unpacked on
demand, slowly: for an occasional reader, not a pass; writing into it changes nothing), and so
does its state dict (``save_pretrained`` saves the dense weights). A weight
another module shares (tied input and output embeddings) is kept as it is and packed in a copy.
``copy.deepcopy`` of a packed module gives an ordinary one with its dense weight, to change and
pack again.

Where fixed-order products are available (``cascade.core.forward.fixed_order``: AVX2, a
compiler once per machine) float32 weights are packed for them instead: invariant at every row
count by construction and, at a few rows, about twice as fast as oneDNN on an AVX2 CPU.
"""

from __future__ import annotations

import copy
import functools
import os
from collections import Counter

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from cascade.core.forward import fixed_order, graph_ops

PACKABLE_DTYPES = (torch.float32, torch.bfloat16)
_PACKED_STATE = ("packed", "kernel", "out_size", "dense_kept")
"""What ``_swap`` adds to a module (dropped by ``_unpack``, not copied by a deep copy)."""


def available(model) -> bool:
    """Whether ``model``'s products can run packed: on the CPU, in float32 or bfloat16, with
    fixed-order products or oneDNN (bfloat16 there needs its bfloat16 instructions: AVX-512 or
    AVX-NE-CONVERT), unless the environment sets ``CASCADE_PACKED_WEIGHTS=0``."""
    return _packable(next(model.parameters()))


def _packable(tensor: torch.Tensor) -> bool:
    return _kernel(tensor) is not None


def _kernel(tensor: torch.Tensor) -> type[_Kernel] | None:
    """The kernel a weight like ``tensor`` is packed for (None: it stays dense): fixed-order
    products where they build, but bfloat16 on a CPU where oneDNN takes the hardware's
    bfloat16 dot products."""
    if (tensor.device.type != "cpu" or tensor.dtype not in PACKABLE_DTYPES
            or os.environ.get("CASCADE_PACKED_WEIGHTS", "1") == "0"):
        return None
    onednn = torch.backends.mkldnn.is_available() and (
        tensor.dtype != torch.bfloat16 or _bfloat16_packs())
    if (tensor.dtype == torch.float32 or not onednn) and fixed_order.available():
        return FixedOrder
    return OneDnn if onednn else None


@functools.cache
def _bfloat16_packs() -> bool:
    """Whether oneDNN packs bfloat16 weights on this CPU (it refuses without AVX-512 or
    AVX-NE-CONVERT: such a CPU keeps bfloat16 products dense)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def is_packed(model) -> bool:
    """Whether any of ``model``'s products runs on a packed weight."""
    return any(isinstance(m, _Packed) for m in model.modules())


def pack(model) -> int:
    """Swap ``model``'s linear modules for packed ones (idempotent); returns how many were
    packed (0 where ``available`` is False)."""
    if not available(model):
        return 0
    shared = Counter(id(p) for m in model.modules() for p in m._parameters.values()
                     if p is not None)
    count = 0
    for module in model.modules():
        kind = _PACKED_KINDS.get(type(module))
        if kind is not None:
            _swap(module, kind, shared[id(module.weight)] > 1)
            count += 1
    return count


def _swap(module: nn.Module, kind: type, keep_dense: bool) -> None:
    """Make ``module`` (an ordinary ``kind.plain``) a packed ``kind``."""
    weight = kind.out_by_in(module.weight).detach()
    kernel = _kernel(weight)
    with torch.no_grad():
        packed = kernel.pack(weight.contiguous())
    module.__class__ = kind
    module.packed, module.kernel, module.out_size = packed, kernel, weight.shape[0]
    module.dense_kept = keep_dense
    if not keep_dense:
        del module._parameters["weight"]


def _unpack(module: nn.Module, kind: type, dense: torch.Tensor) -> None:
    """Make a packed ``module`` an ordinary ``kind`` again, holding ``dense``."""
    for name in _PACKED_STATE:
        delattr(module, name)
    module.__class__ = kind
    if "weight" not in module._parameters:
        module._parameters["weight"] = nn.Parameter(dense)


class _Kernel:
    """How a packed weight is made, multiplied and read back."""

    @staticmethod
    def pack(weight: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @staticmethod
    def product(x: torch.Tensor, packed: torch.Tensor, out: int,
                bias: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError

    @staticmethod
    def dense(packed: torch.Tensor, out: int) -> torch.Tensor:
        raise NotImplementedError


class OneDnn(_Kernel):
    """oneDNN's blocked layout (``_reorder_linear_weight``); an opaque op in a compiled model
    (``cascade.core.forward.graph_ops``)."""

    @staticmethod
    def pack(weight: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._reorder_linear_weight(weight, None)

    @staticmethod
    def product(x: torch.Tensor, packed: torch.Tensor, out: int,
                bias: torch.Tensor | None) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return graph_ops.packed_linear(x, packed, bias)
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")

    @staticmethod
    def dense(packed: torch.Tensor, out: int) -> torch.Tensor:
        return packed.to_dense()


class FixedOrder(_Kernel):
    """``cascade.core.forward.fixed_order``'s panels (its op is opaque to a compiler)."""

    pack = staticmethod(fixed_order.pack)
    product = staticmethod(fixed_order.product)
    dense = staticmethod(fixed_order.unpack)


class _Packed:
    """What packed modules share: ``weight`` reads unpacked, a deep copy is an ordinary module,
    and conversions (``model.to(dtype)``) unpack, convert and pack again where packing is
    still available."""

    plain: type
    packed: torch.Tensor
    kernel: type[_Kernel]
    out_size: int

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernel.product(x, self.packed, self.out_size, self.bias)

    def __getattr__(self, name: str):
        if name == "weight" and "weight" not in self._parameters:  # dropped: unpack it
            return self._dense()
        return super().__getattr__(name)

    def _save_to_state_dict(self, destination, prefix: str, keep_vars: bool) -> None:
        """A state dict (``save_pretrained``) holds the dense weight, unpacked."""
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if "weight" not in self._parameters:
            destination[prefix + "weight"] = self._dense()

    def _load_from_state_dict(self, state_dict, prefix: str, *args) -> None:
        """A dense weight loaded into a packed module is packed in its place."""
        dense = state_dict.pop(prefix + "weight", None)
        if dense is not None and "weight" not in self._parameters:
            with torch.no_grad():
                self.packed = self.kernel.pack(
                    self.out_by_in(dense).to(self.packed.dtype).contiguous())
        elif dense is not None:
            state_dict[prefix + "weight"] = dense
        super()._load_from_state_dict(state_dict, prefix, *args)

    def __deepcopy__(self, memo: dict) -> nn.Module:
        return _unpacked_copy(self, self.plain, self._dense(), memo)

    def _apply(self, fn, recurse: bool = True):
        kept, plain, kind = self.dense_kept, self.plain, type(self)
        _unpack(self, plain, self._dense())
        plain._apply(self, fn, recurse)
        if _packable(self.weight):
            _swap(self, kind, kept)
        return self


def _unpacked_copy(module: nn.Module, kind: type, dense: torch.Tensor, memo: dict) -> nn.Module:
    """A deep copy of a packed ``module`` as an ordinary ``kind`` holding ``dense`` (the
    packed weight cannot be copied, and a copy is made to be changed)."""
    clone = kind.__new__(kind)
    memo[id(module)] = clone
    for name, value in module.__dict__.items():
        if name not in _PACKED_STATE:
            clone.__dict__[name] = copy.deepcopy(value, memo)
    if "weight" not in clone._parameters:
        clone._parameters["weight"] = nn.Parameter(dense)
    return clone


class PackedLinear(_Packed, nn.Linear):
    """An ``nn.Linear`` whose product runs on its packed weight (made by ``pack``)."""

    plain = nn.Linear

    @staticmethod
    def out_by_in(weight: torch.Tensor) -> torch.Tensor:
        """The plain module's weight as the [out, in] matrix that is packed."""
        return weight

    def _dense(self) -> torch.Tensor:
        return self.kernel.dense(self.packed, self.out_size)


class PackedConv1D(_Packed, Conv1D):
    """GPT-2's ``Conv1D`` (x @ W + b, W [in, out]) on its packed transposed weight."""

    plain = Conv1D

    @staticmethod
    def out_by_in(weight: torch.Tensor) -> torch.Tensor:
        return weight.t()

    def _dense(self) -> torch.Tensor:
        return self.kernel.dense(self.packed, self.out_size).t().contiguous()


_PACKED_KINDS = {nn.Linear: PackedLinear, Conv1D: PackedConv1D}

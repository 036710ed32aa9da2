"""Tensor parallelism: a target's weights split over N ranks by the model's own plan.

transformers declares, per architecture, how a decoder layer splits over ranks
(``config.base_model_tp_plan``: the query/key/value and MLP up-projections ``colwise`` — each
rank holds a slice of the output features, so of the attention heads — and the output
projections ``rowwise`` — each rank holds a slice of the input features and the partial
products are summed). ``shard`` applies that plan to a loaded model, in place, on plain local
tensors: each rank keeps its slice of every split weight, and a ``rowwise`` module sums its
partial output over the ranks with ``torch.distributed`` (gloo on the CPU, NCCL on GPUs).
Embeddings, norms and the output head stay whole on every rank, so every rank ends a pass with
the same hidden states and logits.

Why not transformers' own ``from_pretrained(tp_plan=...)``: it keeps DTensor parameters and
replaces each module's ``forward``, which the oneDNN-packed products
(``cascade.core.forward.packed_weights``) cannot take, and it has no plan for GPT-2's fused ``Conv1D``
projections. The plan, the collectives and the process group are the libraries'; only the
slicing (a ``narrow`` per weight) is done here.

Exactness: a position's sum over the ranks never depends on what else is in the pass, so the
batch-invariant pass (``cascade.core.forward.invariant``) keeps its guarantee: the partials are added
in rank order (two ranks swap theirs; more ranks gather them), or, on NCCL with two ranks,
all-reduced (a + b is one number whichever rank adds it; with more ranks an all-reduce may add
in an order that depends on the buffer's size, so on the batch). A sharded pass is not
bit-equal to an unsharded one (the products are summed in another order): equal within float
tolerance.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import operator
import re
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from transformers.pytorch_utils import Conv1D

from cascade.core.kv.kv_store import attention_heads

GPT2_PLAN = {"h.*.attn.c_attn": "packed_colwise", "h.*.attn.c_proj": "rowwise",
             "h.*.mlp.c_fc": "colwise", "h.*.mlp.c_proj": "rowwise"}
"""GPT-2's plan (transformers declares none): its fused query/key/value projection splits each
of the three parts by heads."""
_NO_OP_STYLES = {"replicated_with_grad_allreduce", "replicate"}
"""Styles that keep a weight whole (for training they sum its gradients)."""
_LOCAL = contextvars.ContextVar("cascade_tp_local", default=False)


class TensorParallelError(ValueError):
    """The model cannot be split over the ranks asked for."""


@dataclass(frozen=True)
class Shard:
    """This process's place in the tensor-parallel group."""

    rank: int
    world: int
    group: object = None
    """The process group of the sums (None: the default group)."""
    backend: str = "gloo"
    """The sums' backend: NCCL all-reduces two ranks' partials; otherwise (and for more
    ranks) the partials are exchanged and added in rank order (``_partials``)."""


@contextlib.contextmanager
def local_products():
    """Within it a sharded module returns its own partial product, without summing over the
    ranks (a probe of this rank's kernels, run on one rank alone)."""
    token = _LOCAL.set(True)
    try:
        yield
    finally:
        _LOCAL.reset(token)


def plan_of(model) -> dict[str, str]:
    """The model's plan: module name patterns (``*`` for a layer index, relative to the base
    model) to styles; TensorParallelError when the model has none."""
    plan = getattr(model.config, "base_model_tp_plan", None)
    if not plan and model.config.model_type == "gpt2":
        plan = GPT2_PLAN
    if not plan:
        raise TensorParallelError(
            f"model type {model.config.model_type!r} declares no tensor-parallel plan "
            "(config.base_model_tp_plan): serve it with --tensor-parallel 1")
    return dict(plan)


def check(model, world: int) -> dict[str, str]:
    """The plan, once every split it asks for divides by ``world``; TensorParallelError naming
    what does not."""
    plan = plan_of(model)
    unknown = {s for s in plan.values()} - {"colwise", "rowwise", "packed_colwise"} - _NO_OP_STYLES
    if unknown:
        raise TensorParallelError(
            f"model type {model.config.model_type!r} splits its layers with "
            f"{', '.join(sorted(unknown))}: the verifier splits only colwise and rowwise "
            "linear layers, whole attention heads per rank; serve it with --tensor-parallel 1")
    heads, kv_heads, _ = attention_heads(model.config)
    if heads % world or kv_heads % world:
        raise TensorParallelError(
            f"the target has {heads} attention heads and {kv_heads} key/value heads: "
            f"--tensor-parallel {world} must divide both (try a divisor of {kv_heads})")
    for name, module, style in _planned(model, plan):
        width = _split_width(module, style)
        if width % world:
            raise TensorParallelError(f"{name} has {width} features to split ({style}): "
                                      f"--tensor-parallel {world} must divide them")
    return plan


def shard(model, rank: int, world: int, group=None) -> None:
    """Keep this rank's slice of ``model``'s split weights (in place; before packing them)."""
    if world == 1:
        return
    plan = check(model, world)
    backend = dist.get_backend(group) if dist.is_initialized() else "gloo"
    info = Shard(rank, world, group, backend)
    with torch.no_grad():
        for _, module, style in _planned(model, plan):
            if style in ("colwise", "packed_colwise"):
                _slice_outputs(module, rank, world, 3 if style == "packed_colwise" else 1)
            elif style == "rowwise":
                _slice_inputs(module, rank, world)
                module.cascade_shard = info
                module.register_forward_hook(_sum_over_ranks)
    for module in model.modules():
        if hasattr(module, "split_size") and hasattr(module, "c_attn"):  # GPT-2's attention
            module.split_size //= world
    model.cascade_shard = info


def _planned(model, plan: dict[str, str]):
    """(name, module, style) for each module the plan splits."""
    prefix = getattr(model, "base_model_prefix", "")
    patterns = [(re.compile(re.escape(k).replace(r"\*", r"\d+")), v) for k, v in plan.items()
                if v not in _NO_OP_STYLES]
    for name, module in model.named_modules():
        relative = name[len(prefix) + 1:] if prefix and name.startswith(prefix + ".") else name
        for pattern, style in patterns:
            if pattern.fullmatch(relative):
                yield name, module, style


def _split_width(module: nn.Module, style: str) -> int:
    inputs, outputs = _features(module)
    return inputs if style == "rowwise" else outputs // (3 if style == "packed_colwise" else 1)


def _features(module: nn.Module) -> tuple[int, int]:
    if isinstance(module, Conv1D):
        return module.nx, module.nf
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    raise TensorParallelError(f"{type(module).__name__} is not a linear layer the plan can split")


def _slice_outputs(module: nn.Module, rank: int, world: int, parts: int) -> None:
    """Keep this rank's slice of each of ``parts`` equal parts of the output features."""
    conv = isinstance(module, Conv1D)
    dim = 1 if conv else 0

    def piece(tensor: torch.Tensor, along: int) -> torch.Tensor:
        chunks = tensor.chunk(parts, along)
        size = chunks[0].shape[along] // world
        return torch.cat([c.narrow(along, rank * size, size) for c in chunks], along)

    module.weight = nn.Parameter(piece(module.weight, dim).contiguous(), requires_grad=False)
    if module.bias is not None:
        module.bias = nn.Parameter(piece(module.bias, 0).contiguous(), requires_grad=False)
    if conv:
        module.nf = module.weight.shape[1]
    else:
        module.out_features = module.weight.shape[0]


def _slice_inputs(module: nn.Module, rank: int, world: int) -> None:
    """Keep this rank's slice of the input features; the bias is added once (rank 0)."""
    conv = isinstance(module, Conv1D)
    dim = 0 if conv else 1
    size = module.weight.shape[dim] // world
    weight = module.weight.narrow(dim, rank * size, size).contiguous()
    module.weight = nn.Parameter(weight, requires_grad=False)
    if module.bias is not None and rank:
        module.bias = nn.Parameter(torch.zeros_like(module.bias), requires_grad=False)
    if conv:
        module.nx = size
    else:
        module.in_features = size


def _sum_over_ranks(module: nn.Module, args, output: torch.Tensor) -> torch.Tensor:
    """A rowwise module's output: its partial product summed over the ranks."""
    if _LOCAL.get():
        return output
    return summed(output, _module_shard(module))


def summed(output: torch.Tensor, shard: Shard) -> torch.Tensor:
    """``output`` summed over the ranks, the same number for a position whatever the rest of
    the tensor holds."""
    if shard.world == 2 and shard.backend == "nccl":
        dist.all_reduce(output, group=shard.group)  # a + b: one order whichever rank adds
        return output
    return functools.reduce(operator.add, _partials(output.contiguous(), shard))


def _partials(output: torch.Tensor, shard: Shard) -> list[torch.Tensor]:
    """Every rank's partial, in rank order. Two ranks swap theirs (one send and one receive
    each way: 150 us on gloo over loopback here, where its all-reduce takes 500 us and its
    all-gather 300 us); more ranks gather them."""
    if shard.world > 2:
        parts = [torch.empty_like(output) for _ in range(shard.world)]
        dist.all_gather(parts, output, group=shard.group)
        return parts
    peer, other = 1 - shard.rank, torch.empty_like(output)
    sent = dist.isend(output, _global(peer, shard.group), group=shard.group)
    dist.recv(other, _global(peer, shard.group), group=shard.group)
    sent.wait()
    return [output, other] if shard.rank == 0 else [other, output]


def _global(rank: int, group) -> int:
    return rank if group is None else dist.get_global_rank(group, rank)


def _module_shard(module: nn.Module) -> Shard:
    shard = getattr(module, "cascade_shard", None)
    if shard is None:
        raise RuntimeError("a rowwise module ran outside a sharded model")
    return shard

"""The comparison columns of the engine benchmark (``cascade.bench.step.engine``): transformers'
own forward of the same batch (eager, or compiled with a static cache) and torch's floor, every
weight product alone; the rows' tokens both sides feed."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from transformers import DynamicCache, StaticCache

from cascade.bench.step.device import synchronizer
from cascade.bench.step.report import Shape
from cascade.bench.step.timing import describe, median_ms

if TYPE_CHECKING:
    from cascade.bench.step.engine import EngineBenchConfig


def context_tokens(row: int, length: int, vocab: int) -> list[int]:
    """A row's own tokens (rows share no prefix, so the engine copies none)."""
    generator = torch.Generator().manual_seed(1000 + row)
    return torch.randint(0, vocab, (length,), generator=generator).tolist()


def _ids(shape: Shape, length: int, vocab: int, device: torch.device) -> torch.Tensor:
    """[rows, length] the rows' tokens (the engine's contexts; the step's tokens after)."""
    return torch.tensor([context_tokens(i, length, vocab) for i in range(shape.rows)], device=device)


@torch.inference_mode()
def _hf_forward(model, ids: torch.Tensor, cache, cached: int, keep: int):
    mask = torch.ones(ids.shape[0], cached + ids.shape[1], dtype=torch.long, device=ids.device)
    return model(input_ids=ids, attention_mask=mask, cache=cache, use_cache=True,
                 logits_to_keep=keep)


def hf_prepare(model, forward, shape: Shape, context: int, static: bool
                ) -> Callable[[], Callable[[], object]]:
    """``prepare`` for the bench's timer: a cache holding every row's context (fed by ``model``,
    untimed), cropped back to it before each call of ``forward`` on the step's tokens."""
    vocab = model.get_output_embeddings().weight.shape[0]
    cached = 0 if shape.prefill else context
    new_cache = (partial(StaticCache, max_cache_len=cached + shape.tokens) if static
                 else DynamicCache)
    cache = new_cache(config=model.config)
    step = torch.randint(0, vocab, (shape.rows, shape.tokens),
                         generator=torch.Generator().manual_seed(5)).to(model.device)
    if cached:
        _hf_forward(model, _ids(shape, cached, vocab, model.device), cache, 0, 1)
    elif static:  # allocated outside the compiled graph, as a prefill would (cropped below)
        _hf_forward(model, step, cache, 0, 1)

    def prepare() -> Callable[[], object]:
        nonlocal cache
        if not cached and not static:
            cache = new_cache(config=model.config)  # a prefill builds its own cache
        elif cache.get_seq_length() > cached:
            cache.crop(cached - int(cache.get_seq_length()))
        return partial(_hf_forward, forward, step, cache, cached, shape.kept)

    return prepare


def compile_model(model):
    """``torch.compile`` with dynamic shapes (one compile per dtype; see the module docstring)."""
    torch._dynamo.reset()
    return torch.compile(model, dynamic=True)


def linear_weights(model) -> list[tuple[torch.Tensor, bool, bool]]:
    """Every weight product of ``model``: (weight, is GPT-2's Conv1D (x @ W), is the output
    head)."""
    from transformers.pytorch_utils import Conv1D

    head = model.get_output_embeddings()
    return [(m.weight, isinstance(m, Conv1D), m is head) for m in model.modules()
            if isinstance(m, (torch.nn.Linear, Conv1D))]


def weight_bytes(model) -> int:
    """Bytes of the weights of ``linear_weights`` (a tied weight once)."""
    unique = {w.data_ptr(): w.nbytes for w, _, _ in linear_weights(model)}
    return sum(unique.values())


def floor_inputs(model, shape: Shape) -> list[tuple[torch.Tensor, torch.Tensor, bool]]:
    """(x, weight, is Conv1D) for every product of ``linear_weights``: x has the step's
    ``shape.fed`` rows (the output head's: the positions whose logits the step keeps)."""
    inputs = []
    for weight, conv1d, head in linear_weights(model):
        width = weight.shape[0] if conv1d else weight.shape[1]
        rows = shape.rows * shape.kept if head else shape.fed
        inputs.append((torch.randn(rows, width, dtype=weight.dtype, device=weight.device),
                       weight, conv1d))
    return inputs


def floor_prepare(model, shape: Shape) -> Callable[[], Callable[[], object]]:
    """``prepare`` for the bench's timer: every product of ``floor_inputs``."""
    inputs = floor_inputs(model, shape)

    @torch.inference_mode()
    def call() -> None:
        for x, weight, conv1d in inputs:
            torch.matmul(x, weight) if conv1d else F.linear(x, weight)

    return lambda: call


class CompiledColumn:
    """The compiled column of one dtype: the compiled model, or the reason it failed."""

    def __init__(self, model, enabled: bool) -> None:
        self.model, self.error = (compile_model(model) if enabled else None), None

    def measure(self, model, shape: Shape, config: EngineBenchConfig
                ) -> tuple[float | None, float | None]:
        if self.model is None or self.error is not None:
            return None, None
        try:
            return median_ms(hf_prepare(model, self.model, shape, config.context, True),
                              config.repeats, synchronizer(config.device))
        except Exception as exc:  # noqa: BLE001 - the column stays empty, the run goes on
            self.error = describe(exc)
            return None, None

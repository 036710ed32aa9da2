"""The engine's side of the engine benchmark (``cascade.bench.step.engine``): one ``VerifyEngine``
and its prefilled sequences, set back before every call so each call feeds the same tokens after
the same cached context."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from cascade.bench.step.columns import context_tokens
from cascade.bench.step.report import Shape
from cascade.core.blocks import Draft
from cascade.core.forward.invariant import KEY_BLOCK
from cascade.core.forward.row_rules import padded
from cascade.core.model.runner import ModelRunner
from cascade.core.verify import compiled
from cascade.core.verify.engine import VerifyEngine
from cascade.core.verify.verification import SequenceVerifier
from cascade.protocol.settings import SamplingParams

if TYPE_CHECKING:
    from cascade.bench.step.engine import EngineBenchConfig


def _draft(shape: Shape, vocab: int) -> Draft:
    """The shape's draft after the row's pending token (distinct tokens: a tree's siblings)."""
    tokens = [(7 + 3 * i) % vocab for i in range(shape.tokens - 1)]
    return Draft(tokens, parents=list(shape.parents) if shape.parents else None)


def _step(engine: VerifyEngine, items: list) -> None:
    """One engine step; a row's failure (kept in its slot by the engine) is raised."""
    for result in engine.step(items):
        if isinstance(result, Exception):
            raise result


class EngineRows:
    """One engine and its prefilled sequences, each set back to its post-prefill state before
    every call so that every call feeds the same tokens after the same cached context."""

    def __init__(self, runner: ModelRunner, invariant: bool, config: EngineBenchConfig,
                 forward=None) -> None:
        """``forward``: the model compiled (``cascade.core.verify.compiled``), or None: eager."""
        self.forward = forward
        rows, nodes = max(config.rows, default=1), len(config.tree)
        room = padded(config.context + config.new_tokens + nodes + KEY_BLOCK, KEY_BLOCK)
        fresh = padded(config.prefill + config.new_tokens + nodes + KEY_BLOCK, KEY_BLOCK)
        self.engine = VerifyEngine(runner, kv_tokens=rows * room + fresh, invariant=invariant)
        self.runner, self.nodes, self.prefill_rows = runner, nodes, 0
        self.new_tokens = config.new_tokens
        self.sequences = [self._sequence(context_tokens(i, config.context, runner.vocab_size))
                          for i in range(rows)]
        self._step([(s, Draft([])) for s in self.sequences])
        self.committed = [list(s.committed) for s in self.sequences]

    def _sequence(self, context: list[int]) -> SequenceVerifier:
        return SequenceVerifier(self.runner, context,
                                SamplingParams(max_new_tokens=self.new_tokens),
                                engine=self.engine, tree_room=self.nodes)

    def prepare(self, shape: Shape) -> Callable[[], None]:
        if shape.prefill:
            return self._prepare_prefill(shape)
        draft = _draft(shape, self.runner.vocab_size)
        for sequence, committed in zip(self.sequences[: shape.rows], self.committed):
            sequence.committed = list(committed)
        items = [(s, draft) for s in self.sequences[: shape.rows]]
        return lambda: self._step(items)

    def _step(self, items: list) -> None:
        with compiled.using(self.runner.model, self.forward):
            _step(self.engine, items)

    def _prepare_prefill(self, shape: Shape) -> Callable[[], None]:
        """A fresh sequence (the previous one closed) whose prefill is the call."""
        self.close_prefill()
        self.prefill_rows += 1
        self.fresh = self._sequence(context_tokens(-self.prefill_rows, shape.tokens,
                                             self.runner.vocab_size))
        return lambda: self._step([(self.fresh, Draft([]))])

    def close_prefill(self) -> None:
        if getattr(self, "fresh", None) is not None:
            self.fresh.close()
            self.fresh = None

    def close(self) -> None:
        self.close_prefill()
        for sequence in self.sequences:
            sequence.close()

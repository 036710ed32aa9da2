"""What a verify pass costs against the nodes it carries: a token tree of n nodes beside a chain of
n tokens and a one-token pass, in float32 and bfloat16 side by side (one session, the whole
round: the packed pass, the tree walk and the KV compaction).

    cascade bench tree-cost [--target DIR] [--nodes 1 --nodes 4 --nodes 8 ...] [--repeats 7]
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch
from pydantic import BaseModel, Field, field_validator
from rich.console import Console
from rich.table import Table

from cascade.bench.compare.run import machine
from cascade.core.blocks import Draft
from cascade.core.model.runner import ModelRunner, ModelSpec
from cascade.core.verify.verification import SequenceVerifier
from cascade.protocol.settings import SamplingParams
from cascade.protocol.limits import MAX_DRAFT_TOKENS
from cascade.serving.settings_cli import settings_command

PROMPT_LEN = 64


def bushy_parents(count: int, branching: int = 4) -> list[int]:
    """A tree of ``count`` nodes, each with up to ``branching`` children, breadth first."""
    return [-1 if i < branching else (i - branching) // branching for i in range(count)]


def round_ms(runner: ModelRunner, tokens: int, parents: list[int] | None, repeats: int) -> float:
    """Median time of a round that verifies ``tokens`` drafted tokens (a tree with ``parents``)
    after a PROMPT_LEN-token prompt."""
    times, prompt = [], [(100 + i) % runner.vocab_size for i in range(PROMPT_LEN)]
    for _ in range(repeats):
        sequence = SequenceVerifier(runner, prompt,
                                    SamplingParams(max_new_tokens=MAX_DRAFT_TOKENS + 2),
                                    tree_room=tokens)
        sequence.verify(Draft([]))  # the prefill, not measured
        draft = Draft([7] * tokens, parents=parents) if tokens else Draft([])
        started = time.perf_counter()
        sequence.verify(draft)
        times.append(time.perf_counter() - started)
        sequence.close()
    return 1000 * statistics.median(times)


def measure(target: str, nodes: list[int], repeats: int) -> Table:
    table = Table(title=f"one verify round against its size, {PROMPT_LEN}-token prompt")
    for column in ("dtype", "nodes", "tree ms", "tree / one token", "chain ms",
                   "chain / one token"):
        table.add_column(column, justify="right")
    for dtype in ("float32", "bfloat16"):
        runner = ModelRunner.load(ModelSpec(target, dtype=dtype))
        round_ms(runner, 1, None, 2)  # warm-up
        one = round_ms(runner, 0, None, repeats)
        for n in nodes:
            tree = round_ms(runner, n, bushy_parents(n), repeats)
            chain = round_ms(runner, n, None, repeats) if n <= MAX_DRAFT_TOKENS else None
            table.add_row(dtype, str(n), f"{tree:.1f}", f"{tree / one:.2f}",
                          "-" if chain is None else f"{chain:.1f}",
                          "-" if chain is None else f"{chain / one:.2f}")
        table.add_row(dtype, "0 (one token)", f"{one:.1f}", "1.00", "", "")
    return table


class TreeCostSettings(BaseModel):
    """What a verify round costs against the nodes it carries: a token tree and a chain of n
    tokens beside a one-token pass, in float32 and bfloat16."""

    target: Path | None = Field(None, description="Target model folder (default: "
                                "SmolLM2-135M-Instruct).")
    nodes: list[int] = Field([1, 4, 8, 16, 32, 64], description="Tree sizes in nodes (repeat "
                             "the flag); chains only up to the longest draft.")
    repeats: int = Field(7, ge=1, description="Rounds per size (the median reported).")
    threads: int = Field(1, ge=1, description="torch threads.")

    @field_validator("nodes")
    @classmethod
    def _positive(cls, nodes: list[int]) -> list[int]:
        if any(n < 1 for n in nodes):
            raise ValueError("every size must be at least 1")
        return nodes


def run(settings: TreeCostSettings) -> None:
    """Measure every size in both dtypes and print the table."""
    from cascade.tools.pairs import default_target

    torch.set_num_threads(settings.threads)
    target = default_target(settings.target)
    Console(width=120).print(measure(str(target), settings.nodes, settings.repeats))
    print(machine())


if __name__ == "__main__":
    settings_command(TreeCostSettings, run)()

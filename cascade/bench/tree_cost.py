"""What a verify pass costs against the nodes it carries: a token tree of n nodes beside a chain of
n tokens and a one-token pass, in float32 and bfloat16 side by side (one session, the whole
round: the packed pass, the tree walk and the KV compaction).

    python -m cascade.bench.tree_cost [--target DIR] [--nodes 1,4,8,16,32,64] [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from rich.console import Console
from rich.table import Table

from cascade.bench.run import machine
from cascade.core.blocks import Draft
from cascade.core.model.runner import ModelRunner, ModelSpec
from cascade.core.verify.verification import SequenceVerifier
from cascade.protocol.settings import SamplingParams
from cascade.protocol.limits import MAX_DRAFT_TOKENS

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


def main() -> None:
    from cascade.tools.pairs import default_pair

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default=None)
    parser.add_argument("--nodes", default="1,4,8,16,32,64")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = args.target or str(default_pair(None, None, "smollm2")[0])
    Console(width=120).print(measure(target, [int(n) for n in args.nodes.split(",")],
                                     args.repeats))
    print(machine())


if __name__ == "__main__":
    main()

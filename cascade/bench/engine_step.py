"""The verification engine alone: N sessions' blocks verified one pass each vs. in one batched
pass, side by side, on one torch thread.

    python -m cascade.bench.engine_step [--target DIR] [--k 4] [--sessions 1 4 16 32]

Each session has a 100-token context; every round drafts k tokens (always rejected after the
first, which does not change the cost of the pass). Prints milliseconds per round of all N
sessions and the ratio.
"""

from __future__ import annotations

import argparse
import time

import torch

from cascade.bench.run import machine
from cascade.core.blocks import Draft
from cascade.core.engine import VerifyEngine
from cascade.core.runner import ModelRunner, ModelSpec
from cascade.core.verification import SequenceVerifier
from cascade.protocol.settings import SamplingParams


def _round_s(engine: VerifyEngine, sequences: list, k: int, batched: bool, repeats: int = 3
             ) -> float:
    started = time.perf_counter()
    for _ in range(repeats):
        items = [(s, Draft([1] * k)) for s in sequences]
        if batched:
            engine.step(items)
        else:
            for item in items:
                engine.step([item])
    return (time.perf_counter() - started) / repeats


def measure(runner: ModelRunner, k: int, sizes: list[int]) -> list[tuple[int, float, float]]:
    engine = VerifyEngine(runner, kv_tokens=max(sizes) * 1024)
    rows = []
    for n in sizes:
        params = SamplingParams(max_new_tokens=600)
        sequences = [SequenceVerifier(runner, list(range(100 + i, 200 + i)), params,
                                      engine=engine) for i in range(n)]
        engine.step([(s, Draft([])) for s in sequences])  # prefill
        _round_s(engine, sequences, k, True, 1)  # warm up
        rows.append((n, _round_s(engine, sequences, k, False), _round_s(engine, sequences, k,
                                                                          True)))
        for s in sequences:
            s.close()
    return rows


def main() -> None:
    from cascade.tools.pairs import default_pair

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=None, help="default: SmolLM2-135M-Instruct")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 4, 16, 32])
    args = parser.parse_args()
    torch.set_num_threads(1)
    target = args.target or default_pair(None, None, "smollm2")[0]
    runner = ModelRunner.load(ModelSpec(str(target)))
    print(f"{machine()}, 1 torch thread, k = {args.k}")
    print("| sessions | one pass each (ms) | one batched pass (ms) | ratio |")
    print("|---|---|---|---|")
    for n, alone, batched in measure(runner, args.k, args.sessions):
        print(f"| {n} | {alone * 1000:.0f} | {batched * 1000:.0f} | {alone / batched:.2f} |")


if __name__ == "__main__":
    main()

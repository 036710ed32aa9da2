"""Cascade's core loop in one process vs target-only decoding, same prompts, side by side.

python -m benchmarks.inprocess [--target DIR --drafter DIR] [--k 2 4 8] [--max-tokens 64]
Default pair: the tiny pair built by ``cascade models tiny``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from cascade.drafting import DraftConfig
from cascade.loop import generate
from cascade.runner import ModelRunner, ModelSpec
from cascade.types import SamplingParams

PROMPTS = ["def main():\n", "import os\nimport sys\n", "class Config:\n    \"\"\"",
           "for i in range(10):\n", "# Read the file and", "The quick brown fox"]


def run(target, drafter, prompts, params, k) -> dict:
    tokens, elapsed, accepted, drafted, rounds, outputs = 0, 0.0, 0, 0, 0, []
    for prompt in prompts:
        started = time.perf_counter()
        result = generate(target, prompt, params, drafter if k else None, DraftConfig(k))
        elapsed += time.perf_counter() - started
        tokens += len(result.tokens)
        accepted += result.stats.num_accepted_tokens
        drafted += result.stats.num_draft_tokens
        rounds += result.stats.num_target_passes
        outputs.append(result.tokens)
    return {"tokens_per_s": tokens / elapsed, "acceptance": accepted / drafted if drafted else 0.0,
            "tokens_per_pass": tokens / rounds, "outputs": outputs}


def main(argv: list[str] | None = None) -> Table:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", type=Path)
    parser.add_argument("--drafter", type=Path)
    parser.add_argument("--k", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if not (args.target and args.drafter):
        from cascade.cli_models import default_models_dir
        from cascade.tiny_models import build_tiny_pair

        args.target, args.drafter = build_tiny_pair(default_models_dir() / "tiny")
    target = ModelRunner.load(ModelSpec(str(args.target)))
    drafter = ModelRunner.load(ModelSpec(str(args.drafter)))
    prompts = [target.tokenizer(p).input_ids for p in PROMPTS]
    params = SamplingParams(max_new_tokens=args.max_tokens)
    generate(target, prompts[0], params, drafter, DraftConfig(2))  # warm up
    table = Table(title=f"in-process greedy, {len(prompts)} prompts x {args.max_tokens} tokens")
    for column in ["method", "tokens/s (median)", "speedup", "acceptance", "tokens/pass",
                   "same output"]:
        table.add_column(column, justify="right")
    results = {k: [run(target, drafter, prompts, params, k) for _ in range(args.repeats)]
               for k in [0, *args.k]}
    base_speed = statistics.median(r["tokens_per_s"] for r in results[0])
    for k, runs in results.items():
        speed = statistics.median(r["tokens_per_s"] for r in runs)
        table.add_row("target only" if k == 0 else f"speculative k={k}", f"{speed:.1f}",
                      f"{speed / base_speed:.2f}x", f"{runs[0]['acceptance']:.3f}",
                      f"{runs[0]['tokens_per_pass']:.2f}",
                      str(runs[0]["outputs"] == results[0][0]["outputs"]))
    Console().print(table)
    return table


if __name__ == "__main__":
    main()

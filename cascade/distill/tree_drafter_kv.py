"""What the drafter feeds per round with token trees: the accepted path's entries kept in its
cache (``SequenceCache.keep_grown``) against fed again, side by side on the same prompts.

    python -m cascade.distill.tree_drafter_kv [--prompts 4] [--max-tokens 48] [--invariant]

Runs the default pair in one process (``cascade.core.loop.generate``), dynamic and CAPE trees of
16 nodes at depth 4, the two modes alternated twice; prints the drafter positions fed per round
(filler columns included in the invariant mode) and the drafting time per round, and checks that
both modes emit the same tokens.
"""

from __future__ import annotations

import argparse

import torch
from rich.console import Console
from rich.table import Table

from cascade.bench.compare.run import machine
from cascade.core.loop import generate
from cascade.core.model.runner import ModelRunner, ModelSpec, SequenceCache
from cascade.distill.prompts import prompt_set
from cascade.protocol.chat import chat_prompts_ids
from cascade.protocol.settings import DraftConfig, SamplingParams

CONFIGS = {"dynamic tree": DraftConfig(num_draft_tokens=4, tree_nodes=16, tree_branching=4),
           "CAPE tree": DraftConfig(num_draft_tokens=4, tree_nodes=16,
                                    tree_expansion="confidence")}
KEEP = SequenceCache.keep_grown


def _fed_again(cache: SequenceCache, paths) -> None:
    KEEP(cache, {})  # every fed node dropped at once: the next round feeds the path again


class Counter:
    """Positions the drafter's forward passes feed."""

    def __init__(self, runner: ModelRunner) -> None:
        self.fed, self.forward = 0, runner.forward
        runner.forward = self

    def __call__(self, input_ids, *args, **kwargs):
        self.fed += input_ids.shape[-1]
        return self.forward(input_ids, *args, **kwargs)


def run(target, drafter, counter: Counter, prompts, params, config, keep: bool):
    SequenceCache.keep_grown = KEEP if keep else _fed_again
    counter.fed, rounds, draft_s, outputs = 0, 0, 0.0, []
    try:
        for prompt in prompts:
            result = generate(target, prompt, params, drafter, config)
            rounds += result.stats.num_target_passes
            draft_s += result.timing.draft_s
            outputs.append(result.tokens)
    finally:
        SequenceCache.keep_grown = KEEP
    return counter.fed / rounds, 1000 * draft_s / rounds, outputs


def main() -> None:
    from cascade.tools.pairs import default_pair

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--invariant", action="store_true", help="the drafter pod's default")
    args = parser.parse_args()
    torch.set_num_threads(1)
    target_dir, drafter_dir = default_pair(None, None, "smollm2")
    target = ModelRunner.load(ModelSpec(str(target_dir)))
    drafter = ModelRunner.load(ModelSpec(str(drafter_dir)))
    if args.invariant:
        drafter.set_invariant()
    counter = Counter(drafter)
    prompts = chat_prompts_ids(target.tokenizer, prompt_set(held_out=True)[:args.prompts])
    eos = target.tokenizer.eos_token_id
    params = SamplingParams(max_new_tokens=args.max_tokens, stop_token_ids=(eos,))
    table = Table("tree", "drafter cache", "positions fed / round", "draft ms / round (2 runs)",
                  title=f"{'invariant' if args.invariant else 'plain'} drafter passes")
    for name, config in CONFIGS.items():
        runs = {True: [], False: []}
        for keep in (True, False, True, False):
            runs[keep].append(run(target, drafter, counter, prompts, params, config, keep))
        if runs[True][0][2] != runs[False][0][2]:
            raise SystemExit(f"{name}: the two modes emitted different tokens")
        for keep, label in ((True, "path kept"), (False, "path fed again")):
            table.add_row(name, label, f"{runs[keep][0][0]:.2f}",
                          " / ".join(f"{r[1]:.1f}" for r in runs[keep]))
    Console(width=120).print(table)
    print(machine())


if __name__ == "__main__":
    main()

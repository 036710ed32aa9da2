"""What the drafter feeds per round with token trees: the accepted path's entries kept in its
cache (``SequenceCache.keep_grown``) against fed again, side by side on the same prompts.

    cascade bench tree-drafter-kv [--prompts 4] [--max-tokens 48] [--invariant]

Runs the default pair in one process (``cascade.core.loop.generate``), dynamic and CAPE trees of
16 nodes at depth 4, the two modes alternated twice; prints the drafter positions fed per round
(filler columns included in the invariant mode) and the drafting time per round, and checks that
both modes emit the same tokens.
"""

from __future__ import annotations

import torch
from pydantic import BaseModel, Field
from rich.console import Console
from rich.table import Table

from cascade.bench.compare.run import machine
from cascade.core.loop import generate
from cascade.core.model.runner import ModelRunner, ModelSpec, SequenceCache
from cascade.distill.prompts import prompt_set
from cascade.protocol.request.chat import chat_prompts_ids
from cascade.protocol.settings import DraftConfig, SamplingParams
from cascade.serving.settings_cli import settings_command

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


def measure(target, drafter, counter: Counter, prompts, params, config, keep: bool):
    """(positions fed per round, draft ms per round, the outputs) over ``prompts``, the accepted
    path kept in the drafter's cache (``keep``) or fed again."""
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


class TreeDrafterKvSettings(BaseModel):
    """What the drafter feeds per round with token trees: the accepted path kept in its cache
    against fed again, on the default pair's held-out prompts."""

    prompts: int = Field(4, ge=1, description="Held-out prompts.")
    max_tokens: int = Field(48, ge=1, description="Tokens generated per prompt.")
    invariant: bool = Field(False, description="Batch-invariant drafter passes (the drafter "
                            "pod's default).")


def run(settings: TreeDrafterKvSettings) -> None:
    """Run both trees in both modes, alternated twice, and print the table."""
    from cascade.tools.pairs import default_pair

    s = settings
    torch.set_num_threads(1)
    target_dir, drafter_dir = default_pair(None, None, "smollm2")
    target = ModelRunner.load(ModelSpec(str(target_dir)))
    drafter = ModelRunner.load(ModelSpec(str(drafter_dir)))
    if s.invariant:
        drafter.set_invariant()
    counter = Counter(drafter)
    prompts = chat_prompts_ids(target.tokenizer, prompt_set(held_out=True)[:s.prompts])
    eos = target.tokenizer.eos_token_id
    params = SamplingParams(max_new_tokens=s.max_tokens, stop_token_ids=(eos,))
    table = Table("tree", "drafter cache", "positions fed / round", "draft ms / round (2 runs)",
                  title=f"{'invariant' if s.invariant else 'plain'} drafter passes")
    for name, config in CONFIGS.items():
        runs = {True: [], False: []}
        for keep in (True, False, True, False):
            runs[keep].append(measure(target, drafter, counter, prompts, params, config,
                                      keep))
        if runs[True][0][2] != runs[False][0][2]:
            raise SystemExit(f"{name}: the two modes emitted different tokens")
        for keep, label in ((True, "path kept"), (False, "path fed again")):
            table.add_row(name, label, f"{runs[keep][0][0]:.2f}",
                          " / ".join(f"{r[1]:.1f}" for r in runs[keep]))
    Console(width=120).print(table)
    print(machine())


if __name__ == "__main__":
    settings_command(TreeDrafterKvSettings, run)()

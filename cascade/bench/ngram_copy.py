"""Prompt lookup on prompts whose answers copy from their context (edit code, quote, summarise):
acceptance and speed of ngram, model and ngram_then_model drafting vs target-only, side by side.

python -m cascade.bench.ngram_copy --target DIR --drafter DIR [--max-tokens 96] [--k 4]
"""

from __future__ import annotations

import argparse
import inspect
import textwrap

import torch
from rich.console import Console
from rich.table import Table

from cascade.protocol.chat import chat_prompts_ids
from cascade.protocol.methods import DRAFT_METHODS
from cascade.protocol.settings import DraftConfig
from cascade.core.loop import generate
from cascade.core.features.feature_runner import load_model
from cascade.core.model.runner import ModelRunner, ModelSpec
from cascade.protocol.settings import SamplingParams


def _snippet(function) -> str:
    return textwrap.dedent(inspect.getsource(function))[:600]


def copy_prompts() -> list[str]:
    import json
    import shlex

    code = [_snippet(shlex.quote), _snippet(json.dumps)[:400]]
    text = ("The printing press, invented by Johannes Gutenberg around 1440, made books cheaper "
            "and faster to produce. Before it, scribes copied texts by hand, which took months. "
            "Within decades, printing shops spread across Europe, literacy rose, and ideas "
            "travelled faster than ever before.")
    return [
        f"Add a docstring to this function and return the whole function:\n```python\n{code[0]}```",
        f"Rename the variable `s` to `text` in this code:\n```python\n{code[0]}```",
        f"Fix any typos in this code and return it in full:\n```python\n{code[1]}```",
        f"Repeat this paragraph, then give it a title:\n\n{text}",
        f"Summarize this paragraph in two sentences, quoting it where you can:\n\n{text}",
        f"Rewrite this paragraph in the present tense:\n\n{text}",
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", required=True)
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--k", type=int, default=4)
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    target = ModelRunner.load(ModelSpec(args.target))
    drafter = load_model(ModelSpec(args.drafter), args.target)
    prompts = chat_prompts_ids(target.tokenizer, copy_prompts())
    params = SamplingParams(max_new_tokens=args.max_tokens,
                            stop_token_ids=(target.tokenizer.eos_token_id,))
    methods = [("target only", None, DraftConfig(0)),
               *[(m, drafter if m != "ngram" else None,
                  DraftConfig(args.k, method=m)) for m in DRAFT_METHODS]]
    table = Table(title=f"copy-heavy prompts, greedy, k={args.k}, {len(prompts)} prompts")
    for column in ["drafting", "acceptance", "tokens/pass", "tokens/s", "speedup"]:
        table.add_column(column, justify="right")
    baseline = None
    for name, model, config in methods:
        runs = [generate(target, p, params, model, config) for p in prompts]
        tokens = sum(len(r.tokens) for r in runs)
        speed = tokens / sum(r.elapsed_s for r in runs)
        baseline = baseline or speed
        drafted = sum(r.stats.num_draft_tokens for r in runs)
        accepted = sum(r.stats.num_accepted_tokens for r in runs)
        passes = sum(r.stats.num_target_passes for r in runs)
        table.add_row(name, f"{accepted / drafted:.3f}" if drafted else "–",
                      f"{tokens / passes:.2f}", f"{speed:.1f}", f"{speed / baseline:.2f}x")
    Console().print(table)


if __name__ == "__main__":
    main()

"""Prompt lookup on prompts whose answers copy from their context (edit code, quote, summarise):
acceptance and speed of ngram, model and ngram_then_model drafting vs target-only, side by side.

    cascade bench ngram-copy [--target DIR --drafter DIR] [--max-tokens 96] [--k 4]
"""

from __future__ import annotations

import inspect
import textwrap

import torch
from pydantic import BaseModel, Field
from rich.console import Console
from rich.table import Table

from cascade.protocol.request.chat import chat_prompts_ids
from cascade.protocol.methods import DRAFT_METHODS
from cascade.protocol.settings import DraftConfig
from cascade.core.loop import generate
from cascade.core.features.feature_runner import load_model
from cascade.core.model.runner import ModelRunner, ModelSpec
from cascade.protocol.settings import SamplingParams
from cascade.serving.settings_cli import settings_command
from cascade.tools.pairs import PairSettings


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


class NgramCopySettings(BaseModel):
    """Prompt lookup on prompts whose answers copy from their context: acceptance and speed of
    each drafting method against the target alone (greedy)."""

    models: PairSettings = PairSettings()
    max_tokens: int = Field(96, ge=1, description="Tokens generated per prompt.")
    k: int = Field(4, ge=1, le=32, description="Drafted tokens per round.")


def run(settings: NgramCopySettings) -> None:
    """Generate every prompt with every method and print the table."""
    s = settings
    torch.set_num_threads(2)
    target_dir, drafter_dir = (str(p) for p in s.models.folders())
    target = ModelRunner.load(ModelSpec(target_dir))
    drafter = load_model(ModelSpec(drafter_dir), target_dir)
    prompts = chat_prompts_ids(target.tokenizer, copy_prompts())
    params = SamplingParams(max_new_tokens=s.max_tokens,
                            stop_token_ids=(target.tokenizer.eos_token_id,))
    methods = [("target only", None, DraftConfig(0)),
               *[(m, drafter if m != "ngram" else None,
                  DraftConfig(s.k, method=m)) for m in DRAFT_METHODS]]
    table = Table(title=f"copy-heavy prompts, greedy, k={s.k}, {len(prompts)} prompts")
    for column in ["drafting", "acceptance", "tokens/pass", "tokens/s", "speedup"]:
        table.add_column(column, justify="right")
    baseline = None
    for name, model, config in methods:
        runs = [generate(target, p, params, model, config) for p in prompts]
        baseline = _add_row(table, name, runs, baseline)
    Console().print(table)


def _add_row(table: Table, name: str, runs: list, baseline: float | None) -> float:
    """One method's row (speedup against ``baseline`` tokens/s, else its own); the baseline."""
    tokens = sum(len(r.tokens) for r in runs)
    speed = tokens / sum(r.elapsed_s for r in runs)
    baseline = baseline or speed
    drafted = sum(r.stats.num_draft_tokens for r in runs)
    accepted = sum(r.stats.num_accepted_tokens for r in runs)
    passes = sum(r.stats.num_target_passes for r in runs)
    table.add_row(name, f"{accepted / drafted:.3f}" if drafted else "–",
                  f"{tokens / passes:.2f}", f"{speed:.1f}", f"{speed / baseline:.2f}x")
    return baseline


if __name__ == "__main__":
    settings_command(NgramCopySettings, run)()

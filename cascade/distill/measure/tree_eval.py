"""Chains against token trees in one process: what each commits per target pass and what that
buys in tokens per second, on the default pair (or any pair), side by side in one run.

    cascade bench tree-eval --domain held-out --max-tokens 64 --prompts 12 \\
        --config 0 --config 4 --config 4:16:4 --config 8:64:8 [--dtype bfloat16] \\
        [--temperature 0.7 --rule keyed|recursive]

The drafter may be a feature drafter (``--drafter cascade/assets/smollm2-135m-feature-drafter``:
it reads the target's features; its trees too are grown one drafter pass per depth).
A config is ``k`` (a chain of k; 0: the target alone), ``k:nodes:branching`` (a tree of
depth k) or ``k:nodes:branching:confidence`` (a tree grown by CAPE's confidence-aware
expansion). Greedy by default: every config must emit the same tokens (checked, not assumed);
``--temperature T`` samples, with the position-keyed rule (every config must then also emit
the same tokens for one seed) or the recursive rule (``--rule recursive``: sampled trees
verified against q; chains get speculative sampling).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, Field, field_validator
from rich.console import Console
from rich.table import Table

from cascade.bench.prompts import bench_prompts
from cascade.bench.compare.run import machine
from cascade.distill.prompts import prompt_set
from cascade.protocol.request.chat import chat_prompts_ids
from cascade.core.features.feature_runner import load_model
from cascade.core.loop import generate
from cascade.core.model.runner import ModelRunner, ModelSpec
from cascade.protocol.settings import DraftConfig, SamplingParams
from cascade.protocol.acceptance import AcceptancePolicy, AcceptanceRule
from cascade.protocol.stats import SpecStats
from cascade.serving.settings_cli import settings_command
from cascade.tools.pairs import PairSettings


@dataclass
class Tally:
    """One config over every prompt: the verifier's counters (passes, drafted nodes, emitted
    tokens) and the loop's times."""

    stats: SpecStats = field(default_factory=SpecStats)
    seconds: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0


def parse_config(text: str) -> DraftConfig:
    """``k``, ``k:nodes:branching`` or ``k:nodes:branching:expansion`` (dynamic, confidence);
    a ValueError says what is wrong with any other text."""
    parts = text.split(":")
    if len(parts) not in (1, 3, 4) or not all(p.isdigit() for p in parts[:3]):
        raise ValueError(f"a config is k, k:nodes:branching or k:nodes:branching:expansion, "
                         f"got {text!r}")
    k, nodes, branching = (int(p) for p in parts[:3]) if len(parts) > 1 else (int(text), 0, 4)
    expansion = parts[3] if len(parts) == 4 else "dynamic"
    return DraftConfig(num_draft_tokens=k, tree_nodes=nodes, tree_branching=branching,
                       tree_expansion=expansion)


def label(config: DraftConfig) -> str:
    if config.num_draft_tokens == 0:
        return "target alone"
    if not config.tree_nodes:
        return f"chain k={config.num_draft_tokens}"
    if config.tree_expansion == "confidence":
        return f"CAPE tree: depth {config.num_draft_tokens}, {config.tree_nodes} nodes"
    return (f"tree: depth {config.num_draft_tokens}, {config.tree_nodes} nodes, "
            f"branching {config.tree_branching}")


def run_one(target, drafter, prompt: list[int], params, config, policy, tally: Tally
            ) -> list[int]:
    result = generate(target, prompt, params, drafter if config.num_draft_tokens else None,
                      config, policy)
    tally.stats = tally.stats + result.stats
    tally.seconds += result.elapsed_s
    tally.draft_s += result.timing.draft_s
    tally.verify_s += result.timing.verify_s
    return result.tokens


def measure(settings: TreeEvalSettings, target_dir: Path, drafter_dir: Path
            ) -> list[tuple[DraftConfig, Tally]]:
    """Every config on every prompt (configs take turns on each), each prompt's outputs
    compared with the first config's."""
    target = ModelRunner.load(ModelSpec(str(target_dir), dtype=settings.dtype))
    drafter = load_model(ModelSpec(str(drafter_dir)), str(target_dir))
    configs = settings.draft_configs()
    count = settings.prompts
    if settings.domain == "held-out":  # the drafter's held-out evaluation prompts
        prompts = chat_prompts_ids(target.tokenizer, prompt_set(held_out=True)[:count])
    else:
        prompts = [list(p.token_ids)
                   for p in bench_prompts(target.tokenizer, count, [settings.domain])]
    eos = target.tokenizer.eos_token_id
    params = SamplingParams(temperature=settings.temperature, seed=settings.seed,
                            max_new_tokens=settings.max_tokens,
                            stop_token_ids=(eos,) if eos is not None else ())
    policy = AcceptancePolicy(AcceptanceRule(settings.rule) if settings.temperature
                              else AcceptanceRule.GREEDY)
    tallies = [Tally() for _ in configs]
    for n, prompt in enumerate(prompts, 1):
        outputs = []
        for config, tally in zip(configs, tallies):  # configs take turns on each prompt
            outputs.append(run_one(target, drafter, prompt, params, config, policy, tally))
        differ = [label(c) for c, out in zip(configs, outputs) if out != outputs[0]]
        exact = settings.dtype == "float32" and policy.rule is not AcceptanceRule.RECURSIVE
        if differ and exact:
            raise SystemExit(f"prompt {n}: {', '.join(differ)} emitted other tokens than "
                             f"{label(configs[0])}")
        why = "sampled" if policy.rule is AcceptanceRule.RECURSIVE else "low-precision rounding"
        print(f"prompt {n}/{len(prompts)} done, {len(outputs[0])} tokens; "
              + (f"differ from the first ({why}): {', '.join(differ)}"
                 if differ else "all configs equal"), flush=True)
    return list(zip(configs, tallies))


def report(results, settings: TreeEvalSettings) -> None:
    base, temperature = results[0][1], settings.temperature
    sampling = f"{settings.rule} T={temperature}" if temperature else "greedy"
    table = Table(title=f"{settings.domain}, {settings.dtype} target, {sampling}")
    for column in ("config", "tokens / pass", "nodes / pass", "tokens/s", "vs first",
                   "draft ms / pass", "verify ms / pass"):
        table.add_column(column, justify="left" if column == "config" else "right")
    for config, t in results:
        s, base_rate = t.stats, base.stats.num_emitted_tokens / base.seconds
        passes = s.num_target_passes
        table.add_row(label(config), f"{s.num_emitted_tokens / passes:.2f}",
                      f"{s.num_draft_tokens / passes:.1f}",
                      f"{s.num_emitted_tokens / t.seconds:.2f}",
                      f"{(s.num_emitted_tokens / t.seconds) / base_rate:.2f}x",
                      f"{1000 * t.draft_s / passes:.1f}", f"{1000 * t.verify_s / passes:.1f}")
    Console(width=150).print(table)
    print(machine())


class TreeEvalSettings(BaseModel):
    """Chains against token trees in one process: what each config commits per target pass and
    what that buys in tokens per second, side by side on the same prompts."""

    models: PairSettings = PairSettings()
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = Field(
        "float32", description="The target's dtype: float32, bfloat16, float16 or auto (greedy "
        "outputs must agree only in float32).")
    domain: Literal["prose", "chat", "code", "held-out"] = Field(
        "chat", description="Prompt domain: prose, chat, code, or held-out (the drafter's "
        "held-out evaluation prompts).")
    prompts: int = Field(6, ge=1, description="Prompts of the domain.")
    max_tokens: int = Field(64, ge=1, description="Tokens generated per prompt.")
    config: list[str] = Field(
        ["0", "4", "4:8:2", "4:16:4"], min_length=1, description="Draft configs (repeat the "
        "flag): k (a chain; 0: the target alone), k:nodes:branching or "
        "k:nodes:branching:confidence (trees of depth k); the first is the ratios' base.")
    temperature: float = Field(0.0, ge=0, description="Sampling temperature (0: greedy).")
    rule: Literal["keyed", "recursive"] = Field(
        "keyed", description="The sampled acceptance rule (trees and chains): keyed or "
        "recursive.")
    seed: int = Field(0, description="Sampling seed.")
    threads: int = Field(1, ge=1, description="Torch threads.")

    @field_validator("config")
    @classmethod
    def _configs_parse(cls, config: list[str]) -> list[str]:
        for text in config:
            parse_config(text)
        return config

    def draft_configs(self) -> list[DraftConfig]:
        return [parse_config(text) for text in self.config]


def run(settings: TreeEvalSettings) -> None:
    """Measure every config and print the table."""
    torch.set_num_threads(settings.threads)
    target, drafter = settings.models.folders()  # a folder given alone replaces the pair's
    models = settings.models
    report(measure(settings, models.target or target, models.drafter or drafter), settings)


if __name__ == "__main__":
    settings_command(TreeEvalSettings, run)()

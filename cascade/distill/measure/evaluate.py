"""Measure a drafter against its target: greedy acceptance at draft length k on held-out
prompts (with the real speculative loop), cost per token of each model, and the speedup."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cascade.bench.measure import ideal_speedup, per_token_ms
from cascade.distill.prompts import prompt_set
from cascade.protocol.request.chat import chat_prompts_ids
from cascade.protocol.settings import DraftConfig
from cascade.core.loop import generate
from cascade.core.features.feature_runner import FeatureRunner
from cascade.core.model.runner import ModelRunner
from cascade.protocol.settings import SamplingParams
from cascade.protocol.stats import SpecStats


@dataclass(frozen=True)
class PairReport:
    acceptance: float
    """Accepted / drafted tokens over all prompts (greedy, draft length k)."""
    per_prompt: list[float]
    target_ms: float
    """Target forward pass, 1 token after 128 cached (median)."""
    drafter_ms: float
    speculative_tokens_per_s: float
    target_only_tokens_per_s: float
    mean_accepted_length: float = 1.0
    """1 + accepted / rounds with drafts (the bonus or recovered token included)."""
    position_acceptance: float = 0.0
    """Per-position acceptance alpha = accepted / (accepted + rejections)."""
    k: int = 4
    mean_draft_length: float = 0.0
    """Drafted tokens per block (k, unless blocks were cut short or the length adapted)."""

    @property
    def cost_ratio(self) -> float:
        return self.drafter_ms / self.target_ms

    @property
    def ideal_speedup(self) -> float:
        """What the measured alpha and cost ratio allow (Leviathan et al., verify cost 1)."""
        return ideal_speedup(self.position_acceptance, self.k, self.cost_ratio)

    @property
    def speedup(self) -> float:
        return self.speculative_tokens_per_s / self.target_only_tokens_per_s


def evaluate_pair(target: ModelRunner | FeatureRunner, drafter: ModelRunner | FeatureRunner,
                  num_prompts: int = 12,
                  max_new_tokens: int = 64, k: int = 4, adaptive: bool = False,
                  tree_nodes: int = 0) -> PairReport:
    prompts = chat_prompts_ids(target.tokenizer, prompt_set(held_out=True)[:num_prompts])
    eos = target.tokenizer.eos_token_id
    params = SamplingParams(max_new_tokens=max_new_tokens,
                            stop_token_ids=(eos,) if eos is not None else ())
    per_prompt, stats = [], SpecStats()
    spec_tokens = base_tokens = 0
    spec_s = base_s = 0.0
    for prompt in prompts:
        spec = generate(target, prompt, params, drafter,
                        DraftConfig(k, adaptive=adaptive, tree_nodes=tree_nodes))
        base = generate(target, prompt, params)
        stats = stats + spec.stats
        per_prompt.append(spec.stats.acceptance_rate)
        spec_tokens, spec_s = spec_tokens + len(spec.tokens), spec_s + spec.elapsed_s
        base_tokens, base_s = base_tokens + len(base.tokens), base_s + base.elapsed_s
    with torch.inference_mode():
        target_ms, drafter_ms = per_token_ms(target), per_token_ms(drafter)
    return PairReport(stats.acceptance_rate, per_prompt, target_ms, drafter_ms,
                      spec_tokens / spec_s, base_tokens / base_s, stats.mean_acceptance_length,
                      stats.position_acceptance or 0.0, k, stats.mean_draft_length)

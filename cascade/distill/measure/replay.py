"""Held-out greedy acceptance of feature drafters against draft length k, replayed exactly
(``features.train.greedy_acceptance``) on the target's greedy answers to the held-out prompts (24
answers of at most 160 tokens by default: 3,332 scored positions for SmolLM2-135M-Instruct,
float32 on the CPU).

    cascade bench replay --drafters DIR [--drafters DIR ...] [--target DIR] [--answers 24]
        [--max-new-tokens 160] [--max-k 6]
"""

from __future__ import annotations

from pathlib import Path

import torch
from pydantic import BaseModel, DirectoryPath, Field

from cascade.core.features.feature_drafter import FeatureDrafterConfig
from cascade.core.features.feature_runner import load_weights
from cascade.core.model.vocab_map import VocabMap
from cascade.distill.features.data import FeatureSequence, greedy_answers
from cascade.distill.features.train import build_drafter
from cascade.distill.features.train import greedy_acceptance
from cascade.distill.prompts import prompt_set
from cascade.protocol.request.chat import chat_prompts_ids
from cascade.serving.settings_cli import settings_command


def held_out(model, tokenizer, count: int, max_new_tokens: int) -> list[FeatureSequence]:
    """The target's greedy answers to the first ``count`` held-out prompts, annotated."""
    layers = FeatureDrafterConfig.for_target(model.config).feature_layers
    prompts = chat_prompts_ids(tokenizer, prompt_set(held_out=True))[:count]
    return greedy_answers(model, tokenizer, prompts, max_new_tokens, layers, 32)


def curve(model, folder: Path, sequences: list[FeatureSequence], ks: range) -> list[tuple]:
    """(k, acceptance, mean accepted length) of the drafter in ``folder`` for each k."""
    drafter, vocab = build_drafter(model, VocabMap.load(folder).to_target.tolist(), 0)
    load_weights(drafter, folder)
    drafter.eval()
    return [(k, *greedy_acceptance(drafter, sequences, vocab.to_local, k=k)) for k in ks]


class ReplaySettings(BaseModel):
    """Held-out greedy acceptance of feature drafters against draft length k, replayed on the
    target's greedy answers to the held-out prompts (float32 on the CPU)."""

    drafters: list[Path] = Field(min_length=1, description="Feature drafter folders (repeat "
                                 "the flag).")
    target: DirectoryPath | None = Field(None, description="Target model folder (default: "
                                         "SmolLM2-135M-Instruct).")
    answers: int = Field(24, ge=1, description="Held-out answers replayed.")
    max_new_tokens: int = Field(160, ge=1, description="Tokens per answer, at most.")
    max_k: int = Field(6, ge=1, description="Draft lengths 1 .. this.")


def run(settings: ReplaySettings) -> None:
    """Generate the target's held-out answers, then print each drafter's curve."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cascade.tools.pairs import default_target

    s = settings
    target = default_target(s.target)
    tokenizer = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    sequences = held_out(model, tokenizer, s.answers, s.max_new_tokens)
    scored = sum(len(q.tokens) - q.answer_start for q in sequences)
    print(f"{len(sequences)} held-out answers, {scored} positions")
    for folder in s.drafters:
        for k, acceptance, length in curve(model, folder, sequences, range(1, s.max_k + 1)):
            print(f"{folder}  k={k}  acceptance {acceptance:.3f}  mean accepted length "
                  f"{length:.2f}")


if __name__ == "__main__":
    settings_command(ReplaySettings, run)()

"""``python -m cascade.distill.replay DRAFTER [DRAFTER ...]``: held-out greedy acceptance of
feature drafters against draft length k, replayed exactly (``feature_train.greedy_acceptance``)
on the target's greedy answers to the held-out prompts (24 answers of at most 160 tokens by
default: 3,332 scored positions for SmolLM2-135M-Instruct, float32 on the CPU)."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from cascade.core.features.feature_drafter import FeatureDrafterConfig
from cascade.core.features.feature_runner import load_weights
from cascade.core.model.vocab_map import VocabMap
from cascade.distill.feature_data import FeatureSequence, greedy_answers
from cascade.distill.feature_train import build_drafter
from cascade.distill.feature_train import greedy_acceptance
from cascade.distill.prompts import prompt_set
from cascade.protocol.chat import chat_prompts_ids


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


def main() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cascade.tools.pairs import default_pair

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("drafters", type=Path, nargs="+", help="feature drafter folders")
    parser.add_argument("--target", type=Path, default=None,
                        help="target folder (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--answers", type=int, default=24, help="held-out answers")
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--max-k", type=int, default=6)
    args = parser.parse_args()
    target = args.target or default_pair(None, None, "smollm2")[0]
    tokenizer = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    sequences = held_out(model, tokenizer, args.answers, args.max_new_tokens)
    scored = sum(len(s.tokens) - s.answer_start for s in sequences)
    print(f"{len(sequences)} held-out answers, {scored} positions")
    for folder in args.drafters:
        for k, acceptance, length in curve(model, folder, sequences, range(1, args.max_k + 1)):
            print(f"{folder}  k={k}  acceptance {acceptance:.3f}  mean accepted length "
                  f"{length:.2f}")


if __name__ == "__main__":
    main()

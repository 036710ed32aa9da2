"""Training a feature drafter with EAGLE-3's training-time test, and measuring it.

Loss: for each unrolled step j (weight 0.8^(j-1)), cross-entropy between the drafter's
distribution over its vocabulary and the target's top-k distribution at the same position,
renormalised over the kept vocabulary. ``greedy_acceptance`` replays greedy drafting exactly on
sequences the target answered greedily: the drafted token j after committed position n is the
argmax of step j at position n-2+j, and a round keeps the leading matches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cascade.core.features.feature_drafter import FeatureDrafter, FeatureDrafterConfig
from cascade.core.model.vocab_map import VocabMap
from cascade.distill.features.data import FeatureSequence

STEP_DECAY = 0.8


@dataclass
class Batch:
    stacked: torch.Tensor
    """[B, T, layers * d] target features."""
    next_tokens: torch.Tensor
    """[B, T] x_{t+1} (0 past the end)."""
    target_ids: torch.Tensor
    """[B, T, keep] local ids of the teacher's top tokens at t+1 (V' = unknown)."""
    target_probs: torch.Tensor
    """[B, T, keep] their probabilities, zero for unknown ids, renormalised."""
    scored: torch.Tensor
    """[B, T] bool: positions whose prediction counts."""
    tokens: torch.Tensor
    """[B, T] x_t (for exact greedy replay)."""


def make_batch(sequences: list[FeatureSequence], to_local: torch.Tensor) -> Batch:
    device = sequences[0].features.device
    width = max(len(s.tokens) for s in sequences)
    count, keep = len(sequences), sequences[0].top_ids.shape[-1]
    stacked = torch.zeros(count, width, sequences[0].features.shape[-1], device=device,
                          dtype=sequences[0].features.dtype)
    tokens = torch.zeros(count, width + 1, dtype=torch.long, device=device)
    ids = torch.zeros(count, width, keep, dtype=torch.long, device=device)
    probs = torch.zeros(count, width, keep, device=device)
    scored = torch.zeros(count, width, dtype=torch.bool, device=device)
    for i, s in enumerate(sequences):
        n = len(s.tokens)
        stacked[i, :n], tokens[i, :n] = s.features, s.tokens
        ids[i, : n - 1], probs[i, : n - 1] = s.top_ids[1:n], s.top_probs[1:n].float()
        scored[i, max(s.answer_start - 2, 0) : n - 1] = True
    local = to_local[ids]
    unknown = to_local.max()
    probs = probs * (local != unknown)
    mass = probs.sum(-1, keepdim=True)
    scored &= mass.squeeze(-1) > 0
    return Batch(stacked, tokens[:, 1:], local.clamp(max=unknown - 1),
                 probs / mass.clamp_min(1e-9), scored, tokens[:, :-1])


def ttt_loss(drafter: FeatureDrafter, batch: Batch, num_steps: int
             ) -> tuple[torch.Tensor, list[float]]:
    """The weighted loss and each step's top-1 agreement with the teacher."""
    fused = drafter.fuse_features(batch.stacked)
    states = drafter.unrolled_states(fused, batch.next_tokens, num_steps)
    total, weights, agreement = 0.0, 0.0, []
    positions = torch.arange(batch.scored.shape[1], device=batch.scored.device)
    for step, a in enumerate(states, start=1):
        mask = batch.scored & (positions >= step - 1)[None, :]
        logits = drafter.head(a[mask])  # [scored, V']: the head only where it is scored
        logp = torch.log_softmax(logits.float(), -1)
        ids, probs = batch.target_ids[mask], batch.target_probs[mask]
        soft = -(probs * logp.gather(-1, ids)).sum(-1)
        total = total + STEP_DECAY ** (step - 1) * soft.mean()
        weights += STEP_DECAY ** (step - 1)
        agreement.append(float((ids[:, 0] == logits.argmax(-1)).float().mean()))
    return total / weights, agreement


@torch.inference_mode()
def greedy_acceptance(drafter: FeatureDrafter, sequences: list[FeatureSequence],
                      to_local: torch.Tensor, k: int = 4) -> tuple[float, float]:
    """(acceptance rate, mean accepted length incl. the bonus) of greedy drafting at draft
    length k, replayed exactly on greedy teacher answers."""
    accepted = drafted = rounds = 0
    for sequence in sequences:
        batch = make_batch([sequence], to_local)
        fused = drafter.fuse_features(batch.stacked)
        steps = drafter.unrolled_logits(fused, batch.next_tokens, k)
        guesses = torch.stack([drafter.vocab_ids[s[0].argmax(-1)] for s in steps])  # [k, T]
        a, d, r = _walk(guesses.tolist(), sequence.tokens.tolist(), sequence.answer_start, k)
        accepted, drafted, rounds = accepted + a, drafted + d, rounds + r
    return accepted / max(drafted, 1), 1 + accepted / max(rounds, 1)


def _walk(guesses: list[list[int]], tokens: list[int], start: int, k: int):
    """Rounds of greedy speculative decoding over ``tokens`` from ``start``."""
    n, accepted, drafted, rounds = start - 1, 0, 0, 0
    while n < len(tokens) - 1:
        budget = min(k, len(tokens) - 1 - n)
        run = 0
        while run < budget and guesses[run][n - 1 + run] == tokens[n + 1 + run]:
            run += 1
        accepted, drafted, rounds = accepted + run, drafted + budget, rounds + 1
        n += run + 1
    return accepted, drafted, rounds


def build_drafter(target, vocab: list[int], seed: int) -> tuple[FeatureDrafter, VocabMap]:
    """A fresh drafter on ``target``'s embedding and head, its head kept to ``vocab``."""
    embed = target.get_input_embeddings().weight
    vocab_map = VocabMap(vocab, embed.shape[0])
    torch.manual_seed(seed)
    drafter = FeatureDrafter(FeatureDrafterConfig.for_target(target.config), embed.float(),
                             target.get_output_embeddings().weight.float(), vocab_map.to_target)
    final_norm = getattr(getattr(target, "model", None), "norm", None)
    if final_norm is not None:  # an RMSNorm like ours (Llama family): start from the target's
        drafter.norm.weight.data.copy_(final_norm.weight.float())
    return drafter.to(embed.device), vocab_map

"""Slow, obvious versions of the acceptance rules, one session and one position at a time.

They follow the papers line by line and exist only to check cascade.core.accept.acceptance on random inputs.
They consume the same random numbers (u_accept[i], u_sample[i]) in the same way.
"""

from __future__ import annotations

import torch


def _inverse_cdf(weights: list[float], uniform: float) -> int:
    total = sum(weights)
    target = uniform * total
    running = 0.0
    last_positive = max(i for i, w in enumerate(weights) if w > 0)
    for token, weight in enumerate(weights):
        running += weight
        if weight > 0 and running > target:
            return token
    return last_positive


def greedy_accept_reference(draft: list[int], target_logits: torch.Tensor) -> tuple[int, int]:
    """draft: k tokens; target_logits: [k+1, vocab]. Returns (num_accepted, next_token)."""
    for i, token in enumerate(draft):
        best = int(target_logits[i].argmax())
        if token != best:
            return i, best
    return len(draft), int(target_logits[len(draft)].argmax())


def speculative_accept_reference(
    draft: list[int],
    target_probs: torch.Tensor,  # [k+1, vocab]
    draft_probs: torch.Tensor,  # [k, vocab]
    u_accept: list[float],
    u_sample: list[float],
) -> tuple[int, int]:
    """Leviathan et al. 2023, Algorithm 1, with the given random numbers."""
    for i, token in enumerate(draft):
        p = target_probs[i].double().tolist()
        q = draft_probs[i].double().tolist()
        ratio = p[token] / q[token] if q[token] > 0 else float(p[token] > 0)
        if u_accept[i] < min(1.0, ratio):
            continue
        residual = [max(0.0, pv - qv) for pv, qv in zip(p, q)]
        if sum(residual) <= 0:
            residual = p
        return i, _inverse_cdf(residual, u_sample[i])
    k = len(draft)
    return k, _inverse_cdf(target_probs[k].double().tolist(), u_sample[k])

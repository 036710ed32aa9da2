"""Speculative cascades (Narasimhan et al., "Faster Cascades via Speculative Decoding", ICLR 2025):
per-position deferral rules that decide what target the drafted tokens are verified against.

Terms: p is the target's distribution and q the drafter's at one drafted position. A rule builds
the position's **cascade target** pi; speculative sampling then runs against pi instead of p
(accept d with probability min(1, pi(d) / q(d)); on rejection draw from norm(max(0, pi - q)));
the bonus position has no q and keeps p. A position is **deferred** when the target decides it:
for the sequence-level rules when pi = p; for the token-level rules when the drafted token is
outside the accepted set A.

Decisions use ``p_decide`` and ``q_decide`` (temperature-1 probabilities); pi mixes ``p`` and
``q``, the distributions sampling uses. With alpha the quality knob:

- Chow:  keep q (pi = q) iff max q >= 1 - alpha, else pi = p.
- Diff:  keep q iff max q >= max p - alpha.
- OPT:   keep q iff max q >= max p - alpha * TV(q, p), TV = sum(max(0, q - p)).
- token_v1: A = {v : q(v) >= max p - alpha};  token_v2: A = {v : p(v) >= max p - alpha};
  token_v3: A = {v : p(v) >= (1 - alpha) max p};
  pi(v) = q(v) 1[v in A] + (1 - sum_{u in A} q(u)) p(v).

Every function here is pure and batched (shapes [B, k, vocab]); ``cascades_reference`` beside it
holds the slow loops they are tested against. These rules are lossy by design: the emitted
tokens follow pi, not p.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Rule = Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]


def total_variation(q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """sum(max(0, q - p)) over the vocabulary.  # [B, k]"""
    return (q - p).clamp_min(0).sum(-1)


def chow_keeps(p: torch.Tensor, q: torch.Tensor, alpha: float) -> torch.Tensor:
    """[B, k] bool: the drafter is confident enough on its own."""
    return q.amax(-1) >= 1 - alpha


def diff_keeps(p: torch.Tensor, q: torch.Tensor, alpha: float) -> torch.Tensor:
    return q.amax(-1) >= p.amax(-1) - alpha


def opt_keeps(p: torch.Tensor, q: torch.Tensor, alpha: float) -> torch.Tensor:
    return q.amax(-1) >= p.amax(-1) - alpha * total_variation(q, p)


def token_v1_set(p: torch.Tensor, q: torch.Tensor, alpha: float) -> torch.Tensor:
    """[B, k, vocab] bool: the accepted set A."""
    return q >= p.amax(-1, keepdim=True) - alpha


def token_v2_set(p: torch.Tensor, q: torch.Tensor, alpha: float) -> torch.Tensor:
    return p >= p.amax(-1, keepdim=True) - alpha


def token_v3_set(p: torch.Tensor, q: torch.Tensor, alpha: float) -> torch.Tensor:
    return p >= (1 - alpha) * p.amax(-1, keepdim=True)


SEQUENCE_RULES: dict[str, Rule] = {"chow": chow_keeps, "diff": diff_keeps, "opt": opt_keeps}
TOKEN_RULES: dict[str, Rule] = {"token_v1": token_v1_set, "token_v2": token_v2_set,
                                "token_v3": token_v3_set}


def cascade_target(name: str, alpha: float, p_decide: torch.Tensor, q_decide: torch.Tensor,
                   p: torch.Tensor, q: torch.Tensor, drafted: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(pi [B, k, vocab], deferred [B, k] bool) for rule ``name``.

    p_decide, q_decide: temperature-1 distributions the decision reads; p, q: the distributions
    sampling uses (pi mixes these); drafted: [B, k] the drafted tokens."""
    if name in SEQUENCE_RULES:
        keep = SEQUENCE_RULES[name](p_decide, q_decide, alpha)  # [B, k]
        return torch.where(keep.unsqueeze(-1), q, p), ~keep
    accepted_set = TOKEN_RULES[name](p_decide, q_decide, alpha)  # [B, k, vocab]
    kept_mass = (q * accepted_set).sum(-1, keepdim=True)  # [B, k, 1]
    pi = q * accepted_set + (1 - kept_mass).clamp_min(0) * p
    in_set = accepted_set.gather(-1, drafted.clamp_min(0).unsqueeze(-1)).squeeze(-1)
    return pi, ~in_set

"""Guessing a round's outcome before its verdict (speculative speculative decoding, "Saguaro").

A round's outcome is (a, t): the verifier accepts the first a drafted tokens and then commits its
own token t (the recovered token at position a, or the bonus token when a = k). While the block is
verified, the drafter pre-drafts the next block for its likeliest outcomes. The drafter's own
distributions rank them: with q_i its distribution at drafted position i (i = k: the bonus
position) and d_i the drafted tokens,

    score(a, t) = q_0(d_0) ... q_{a-1}(d_{a-1}) * q_a(t),    t != d_a,

the drafter's chance that the first a drafts survive and the target then picks t. Each position
offers its top ``fanout`` tokens other than the drafted one, so the guesses per position fall
geometrically with the prefix product: later positions get fewer useful guesses without a
separate schedule, and ``max_blocks`` caps the total.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cascade.protocol.settings import SamplingParams


@dataclass(frozen=True, order=True)
class Outcome:
    """What verifying one block decided, as far as the next block depends on it."""

    num_accepted: int
    next_token: int

    def context(self, committed: list[int], drafted: list[int]) -> list[int]:
        """The committed tokens after a block of ``drafted`` tokens ended this way."""
        return committed + drafted[: self.num_accepted] + [self.next_token]


@dataclass(frozen=True)
class Guess:
    score: float
    outcome: Outcome


def rank_outcomes(probs: torch.Tensor, drafted: list[int], fanout: int, max_guesses: int
                  ) -> list[Guess]:
    """The likeliest outcomes of a block, best first.

    ``probs``: [len(drafted) + 1, vocab] the drafter's distribution at each drafted position
    and at the bonus position after them."""
    if fanout <= 0 or max_guesses <= 0:
        return []
    guesses, prefix = [], 1.0
    width = min(fanout + 1, probs.shape[-1])
    for a, row in enumerate(probs):
        values, ids = row.topk(width)
        drafted_here = drafted[a] if a < len(drafted) else None
        candidates = [(float(v), int(i)) for v, i in zip(values, ids) if int(i) != drafted_here]
        guesses.extend(Guess(prefix * v, Outcome(a, t)) for v, t in candidates[:fanout])
        if drafted_here is None:
            break
        prefix *= float(row[drafted_here])
    guesses.sort(key=lambda g: (-g.score, g.outcome))
    return guesses[:max_guesses]


def ends_generation(outcome: Outcome, drafted: list[int], context_len: int, prompt_len: int,
                    sampling: SamplingParams) -> bool:
    """Whether a round ending this way (committed length ``context_len`` after it) finishes
    the generation (a stop token among its tokens, or the length limit): no block follows."""
    new = drafted[: outcome.num_accepted] + [outcome.next_token]
    return (any(t in sampling.stop_token_ids for t in new)
            or context_len - prompt_len >= sampling.max_new_tokens)

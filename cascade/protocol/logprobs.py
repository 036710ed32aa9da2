"""Log-probabilities of emitted tokens, as the verifier computes them and the API returns them
(torch-free: the gateway reads them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TokenLogprobs:
    """The target's log-probabilities at one emitted position: the log-softmax of its logits
    (before temperature or top-k/top-p), computed in the pass that verified the token."""

    logprob: float
    top_ids: tuple[int, ...] = ()
    """The most likely tokens at the position, most likely first."""
    top_logprobs: tuple[float, ...] = ()

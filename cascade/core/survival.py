"""Per-position acceptance estimates: how likely each drafted position is to be accepted.

A round that verified n drafted tokens and accepted a of them observed positions 1 .. min(a + 1,
n): the first a accepted, position a + 1 (if verified) rejected; later positions were not
reached. The conditional acceptance rate of each position (accepted given reached) is a moving
average of those observations; survival S_i, the chance that position i is reached *and*
accepted, is their running product. A session starts from its method's pooled estimate (every
session of that drafting method on this verifier), so its first rounds are planned from what
similar sessions did rather than from a fixed guess.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cascade.protocol.settings import MAX_DRAFT_TOKENS

PRIOR = 0.5
"""Conditional acceptance before anything was observed (the pooled estimate takes over fast)."""
SESSION_WEIGHT = 0.3
"""Weight of one observation in a session's moving average."""
POOLED_WEIGHT = 0.05
"""Weight of one observation in the pooled (per-method) moving average."""


@dataclass
class AcceptanceRates:
    """Moving averages of the conditional acceptance rate of positions 1 .. MAX_DRAFT_TOKENS."""

    weight: float
    rates: list[float] = field(default_factory=lambda: [PRIOR] * MAX_DRAFT_TOKENS)
    num_rounds: int = 0

    def observe(self, num_verified: int, num_accepted: int) -> None:
        """One round: ``num_verified`` drafted tokens were verified, ``num_accepted`` kept."""
        if num_verified <= 0:
            return
        self.num_rounds += 1
        for position in range(min(num_accepted + 1, num_verified)):
            hit = 1.0 if position < num_accepted else 0.0
            self.rates[position] += self.weight * (hit - self.rates[position])

    def survival(self, length: int) -> list[float]:
        """S_1 .. S_length."""
        out, alive = [], 1.0
        for rate in self.rates[:length]:
            alive *= rate
            out.append(alive)
        return out

    def copy_as(self, weight: float) -> AcceptanceRates:
        return AcceptanceRates(weight, list(self.rates), 0)


class SurvivalBook:
    """The pooled estimate per drafting method, and each session's own (keyed by any id)."""

    def __init__(self) -> None:
        self.pooled: dict[str, AcceptanceRates] = {}
        self.sessions: dict[object, AcceptanceRates] = {}

    def of(self, key: object, method: str) -> AcceptanceRates:
        """The session's estimate (started from its method's pooled one)."""
        if key not in self.sessions:
            pooled = self.pooled.setdefault(method, AcceptanceRates(POOLED_WEIGHT))
            self.sessions[key] = pooled.copy_as(SESSION_WEIGHT)
        return self.sessions[key]

    def observe(self, key: object, method: str, num_verified: int, num_accepted: int) -> None:
        self.of(key, method).observe(num_verified, num_accepted)
        self.pooled[method].observe(num_verified, num_accepted)

    def forget(self, key: object) -> None:
        self.sessions.pop(key, None)

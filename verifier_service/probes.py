"""Probes: a planned session the plan keeps at 0 (decoded alone), whose drafter sends no shadow
blocks, is *probed* every so many rounds with a short block, verified whatever it costs, so a
drafter that starts paying again is noticed. Its length is the cheapest pass of up to
``MAX_PROBE_TOKENS`` drafts (measured passes are not monotone in their length). A probe that
does not pay doubles the interval (up to ``most_every``), for its session and for every later
session of its drafting method on this verifier; a round that pays halves both (down to
``every``)."""

from __future__ import annotations

from dataclasses import dataclass

from cascade.core.plan.goodput import StepCost
from cascade.core.verify.step_cost import StepShape

MAX_PROBE_TOKENS = 4
"""Most drafted tokens a probe asks for (the first positions carry most of a block's value)."""


@dataclass
class ProbeClock:
    """One session's probe schedule."""

    every: int = 8
    """Rounds at 0 between its probes."""
    until: int = 0
    """Rounds at 0 left before the next probe (0: not counting)."""
    is_probing: bool = False
    """Its block being verified now is a probe."""


class Probes:
    def __init__(self, cost: StepCost, every: int = 8, most_every: int = 128) -> None:
        self.cost, self.every, self.most_every = cost, every, most_every
        self.pooled: dict[str, int] = {}
        """method -> the probe interval a new session of that drafting method starts with."""

    def clock(self, method: str) -> ProbeClock:
        """A new session's schedule, at its method's interval."""
        return ProbeClock(self.pooled.get(method, self.every))

    def paid(self, method: str, clock: ProbeClock) -> None:
        """The session's drafts pay: probes, when they next stop paying, come sooner again."""
        clock.until, clock.is_probing = 0, False
        clock.every = max(self.every, clock.every // 2)
        self.pooled[method] = max(self.every, self.pooled.get(method, self.every) // 2)

    def at_zero(self, method: str, clock: ProbeClock, most: int) -> int:
        """A round the plan keeps the session at 0: a probe's length when one is due, else 0."""
        if clock.is_probing:  # the probe did not pay: wait longer before the next one
            clock.every = min(2 * clock.every, self.most_every)
            self.pooled[method] = min(2 * self.pooled.get(method, self.every), self.most_every)
        clock.is_probing = False
        if clock.until <= 0:
            clock.until = clock.every
        clock.until -= 1
        if clock.until:
            return 0
        clock.is_probing = True
        return self.length(most)

    def length(self, most: int) -> int:
        """The probe length in [1, MAX_PROBE_TOKENS] (at most the session's k, ``most``) whose
        one-row pass is cheapest (the longest among equals)."""
        lengths = range(1, max(1, min(MAX_PROBE_TOKENS, most)) + 1)
        return min(lengths, key=lambda n: (self.cost.predict(StepShape(1, 1 + n, 0)), -n))

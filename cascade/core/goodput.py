"""Speculate only where it pays: how many drafted tokens of each block one verifier pass takes.

Glossary (as in cascade.core.acceptance): a *slot* is one drafted position of one session's
block; its *survival* S_i is the chance that position i is reached and accepted (the product
of the conditional acceptance rates of positions 1..i). Every row of a pass commits one token
of the target's own (recovered or bonus) whatever it drafted, so a row with n slots commits
1 + S_1 + ... + S_n tokens in expectation.

The plan maximises expected committed tokens per second of verifier time for the whole pass:

    rate = sum over rows (1 + sum of their slots' S_i) / (T(pass) + idle)

where T is the step-cost model's time for the pass (cascade.core.step_cost; it knows whether
wide passes are nearly free, as on GPUs or AMX in bfloat16, or cost about 2x, as in float32 on
AVX2) and ``idle`` the verifier's wait for the next blocks, which longer blocks amortise. Every
planned row starts at its floor (0, or a probe's length); the candidate slots are ranked by
survival, and the pass takes the best-ranked prefix of them: the one with the highest rate.
That is the marginal-slot rule (a slot is worth adding while its expected tokens buy more than
its share of the pass) made robust to pass costs that are not convex: measured CPU passes are
jagged (a 5-token pass can cost less than a 3-token one), so a slot that does not pay alone
may pay with the next ones, and the search looks at every prefix rather than stopping at the
first slot that does not pay. Drafting time counts against a slot in proportion to the
verifier's idle share: with few sessions the verifier waits for the drafter, with many it does
not.

Stability: a slot past a row's previous length counts ``HYSTERESIS`` less, so noise in the
estimates does not flip lengths every round; acceptance estimates are moving averages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from cascade.core.step_cost import StepShape

HYSTERESIS = 0.05
"""A slot past a row's previous length counts this share less (it must pay that much more)."""


class StepCost(Protocol):
    def predict(self, shape: StepShape) -> float:
        """Seconds one pass of this shape takes."""
        ...


@dataclass(frozen=True)
class RowPlan:
    """What the plan needs of one row of the pass."""

    num_drafted: int
    """Drafted tokens in the row's block (the most the plan can take)."""
    survival: Sequence[float]
    """S_1 .. S_num_drafted: the chance each drafted position is reached and accepted."""
    num_cached: int
    """Positions the row attends to besides its new ones (its committed length)."""
    floor: int = 0
    """Slots the row verifies whatever they cost (a probe), at most num_drafted."""
    previous: int = 0
    """Slots the row verified last round (hysteresis)."""
    draft_s_per_token: float = 0.0
    """The drafter's time per drafted token (on the verifier's critical path when it idles)."""
    is_planned: bool = True
    """False: the row verifies its whole block (a fixed or drafter-adaptive schedule)."""
    base_tokens: int = 1
    """Tokens the row feeds besides its planned slots (its last committed token; a prefill's
    whole context; an unplanned row's block)."""


@dataclass(frozen=True)
class PlanInputs:
    rows: Sequence[RowPlan]
    idle_s: float = 0.0
    """The verifier's expected wait for the next blocks after this pass (seconds)."""
    idle_share: float = 0.0
    """Share of the verifier's time it spends waiting (0: always busy), in [0, 1]."""


def plan_pass(inputs: PlanInputs, cost: StepCost) -> list[int]:
    """How many drafted tokens of each row the pass verifies (see the module docstring)."""
    rows = inputs.rows
    lengths = [r.num_drafted if not r.is_planned else min(r.floor, r.num_drafted) for r in rows]
    slots = _slots_by_survival(rows, lengths)
    expected = sum(1 + sum(r.survival[: n]) for r, n in zip(rows, lengths))
    counts, extra = list(lengths), 0.0
    best, best_rate = 0, expected / (cost.predict(_shape(rows, counts)) + inputs.idle_s)
    for taken, (value, r) in enumerate(slots, start=1):
        counts[r] += 1
        expected += value
        extra += inputs.idle_share * rows[r].draft_s_per_token
        rate = expected / (cost.predict(_shape(rows, counts)) + inputs.idle_s + extra)
        if rate > best_rate:
            best, best_rate = taken, rate
    for _, r in slots[:best]:
        lengths[r] += 1
    return lengths


def _slots_by_survival(rows: Sequence[RowPlan], lengths: list[int]) -> list[tuple[float, int]]:
    """(value, row index) of the candidate slots, best first: a slot's survival, discounted by
    ``HYSTERESIS`` past its row's previous length (a row's slots stay in order, as survival
    only falls along a block)."""
    slots = [(row.survival[i] / (1 + HYSTERESIS if i >= row.previous else 1.0), r, i)
             for r, row in enumerate(rows) if row.is_planned
             for i in range(lengths[r], row.num_drafted)]
    slots.sort(key=lambda slot: (-slot[0], slot[1], slot[2]))
    return [(value, r) for value, r, _ in slots]


def _shape(rows: Sequence[RowPlan], lengths: list[int]) -> StepShape:
    fed = [r.base_tokens + n for r, n in zip(rows, lengths)]
    return StepShape(num_rows=len(rows), num_tokens=sum(fed),
                     num_cached=sum(r.num_cached for r in rows),
                     num_decode_cached=sum(r.num_cached for r, n in zip(rows, fed) if n == 1))

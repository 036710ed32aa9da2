"""Speculate only where it pays: how many drafted tokens of each block one verifier pass takes.

Glossary (as in cascade.core.accept.acceptance): a *slot* is one drafted position of one session's
block; its *survival* S_i is the chance that position i is reached and accepted (the product
of the conditional acceptance rates of positions 1..i). Every row of a pass commits one token
of the target's own (recovered or bonus) whatever it drafted, so a row with n slots commits
1 + S_1 + ... + S_n tokens in expectation.

The plan maximises expected committed tokens per second of verifier time for the whole pass:

    rate = sum over rows (1 + sum of their slots' S_i) / (T(pass) + wait)

where T is the step-cost model's time for the pass (cascade.core.verify.step_cost; it knows whether
wide passes are nearly free, as on GPUs or AMX in bfloat16, or cost about 2x, as in float32 on
AVX2) and ``wait`` what drafting makes the verifier wait before its next pass: a row that
drafts sends its next block only after a round trip to its drafter (and its drafting, where
that is not hidden, and its queue on a busy drafter pod: the measured time from verdict to
block), while a row decoded alone is ready at once. While some row is ready, the scheduler
holds no step for a drafting row: the verifier does not wait, but the row misses the steps that
pass during its round trip, so its round's tokens count spread over 1 + those steps. With
every row drafting the verifier idles until the first block is back (``wait``), and slower rows
miss steps as well. So drafting costs a lone session the whole round trip, among sessions
decoded alone it pays only where a round commits more than the steps it misses would have,
and a drafter pod too slow for its sessions makes the verifier idle, which the plan sees.
Every
planned row starts at its floor (0, or a probe's length); the candidate slots are ranked by
survival, and the pass takes the best-ranked prefix of them: the one with the highest rate.
That is the marginal-slot rule (a slot is worth adding while its expected tokens buy more than
its share of the pass) made robust to pass costs that are not convex: measured CPU passes are
jagged (a 5-token pass can cost less than a 3-token one), so a slot that does not pay alone
may pay with the next ones, and the search looks at every prefix rather than stopping at the
first slot that does not pay.

Stability: a slot past a row's previous length counts ``HYSTERESIS`` less, so noise in the
estimates does not flip lengths every round; acceptance estimates are moving averages.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from cascade.core.verify.step_cost import StepShape

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
    wait_s: float = 0.0
    """The round trip to the row's drafter besides drafting (the verdict's way there, the
    block's way back, the pod's queue), measured."""
    draft_token_s: float = 0.0
    """The drafter's time per drafted token, measured: a row drafting n tokens is back after
    wait_s + n * draft_token_s."""
    is_planned: bool = True
    """False: the row verifies its whole block (a fixed or drafter-adaptive schedule)."""
    base_tokens: int = 1
    """Tokens the row feeds besides its planned slots (its last committed token; a prefill's
    whole context; an unplanned row's block)."""


@dataclass(frozen=True)
class PlanInputs:
    rows: Sequence[RowPlan]


def plan_pass(inputs: PlanInputs, cost: StepCost) -> list[int]:
    """How many drafted tokens of each row the pass verifies (see the module docstring)."""
    rows = inputs.rows
    lengths = [r.num_drafted if not r.is_planned else min(r.floor, r.num_drafted) for r in rows]
    slots = _slots_by_survival(rows, lengths)
    tally = _Tally(rows, lengths)
    best, best_rate = 0, tally.rate(cost)
    for taken, (_, r) in enumerate(slots, start=1):
        tally.add(r)
        rate = tally.rate(cost)
        if rate > best_rate:
            best, best_rate = taken, rate
    for _, r in slots[:best]:
        lengths[r] += 1
    return lengths


class _Tally:
    """The rate of the pass as slots are added one by one, kept up to date instead of summed
    over every row for every candidate: adding a slot changes its row and the pass's shape, so
    only the drafting rows (whose share depends on the pass's time) are counted again.

    A drafting row's next block comes back after its round trip (``wait_s``). While some row
    is ready at once (decoded alone) the verifier goes on without it, and the row misses the
    steps that pass meanwhile; with every row drafting the verifier idles until the first block
    is back, and rows slower than that miss steps too. A row's round counts its tokens spread
    over 1 + the steps it misses."""

    def __init__(self, rows: Sequence[RowPlan], counts: list[int]) -> None:
        self.rows, self.counts = rows, list(counts)
        shape = _shape(rows, self.counts)
        self.num_tokens, self.num_cached = shape.num_tokens, shape.num_cached
        self.num_decode_cached = shape.num_decode_cached
        self.zero = sum(n == 0 for n in self.counts)
        self.values = [sum(_slot_value(row, i) for i in range(n)) if row.is_planned else 0.0
                       for row, n in zip(rows, self.counts)]
        self.waits = [r.wait_s + n * r.draft_token_s for r, n in zip(rows, self.counts)]
        self.got = [1 + (sum(row.survival[:n]) if not row.is_planned else self.values[i])
                    for i, (row, n) in enumerate(zip(rows, self.counts))]
        self.drafting = [i for i, (row, n) in enumerate(zip(rows, self.counts))
                         if n and row.is_planned]

    def add(self, r: int) -> None:
        """One more slot in row ``r`` (a planned row)."""
        row, n = self.rows[r], self.counts[r]
        fed = row.base_tokens + n
        if fed in (0, 1):  # a decoding row (one token fed) no more, or now
            self.num_decode_cached += row.num_cached if fed == 0 else -row.num_cached
        if n == 0:
            self.zero -= 1
            self.drafting.append(r)
        self.values[r] += _slot_value(row, n)
        self.counts[r] = n + 1
        self.num_tokens += 1
        self.waits[r] = row.wait_s + (n + 1) * row.draft_token_s

    def rate(self, cost: StepCost) -> float:
        """Expected committed tokens per second of verifier time."""
        seconds = cost.predict(StepShape(len(self.rows), self.num_tokens, self.num_cached,
                                         self.num_decode_cached))
        ready = self.zero > 0
        idle = 0.0 if ready or not self.drafting else min(self.waits[i] for i in self.drafting)
        cycle = seconds + idle
        for i in self.drafting:
            missed = math.ceil(max(0.0, self.waits[i] - idle) / cycle)
            self.got[i] = (1 + self.values[i]) / (1 + (max(1, missed) if ready else missed))
        return sum(self.got) / cycle


def _slots_by_survival(rows: Sequence[RowPlan], lengths: list[int]) -> list[tuple[float, int]]:
    """(value, row index) of the candidate slots, best first: a slot's survival, discounted by
    ``HYSTERESIS`` past its row's previous length (a row's slots stay in order, as survival
    only falls along a block)."""
    slots = [(_slot_value(row, i), r, i) for r, row in enumerate(rows) if row.is_planned
             for i in range(lengths[r], row.num_drafted)]
    slots.sort(key=lambda slot: (-slot[0], slot[1], slot[2]))
    return [(value, r) for value, r, _ in slots]


def _slot_value(row: RowPlan, i: int) -> float:
    """Slot i's survival, discounted by ``HYSTERESIS`` past the row's previous length."""
    return row.survival[i] / (1 + HYSTERESIS if i >= row.previous else 1.0)


def _shape(rows: Sequence[RowPlan], lengths: list[int]) -> StepShape:
    fed = [r.base_tokens + n for r, n in zip(rows, lengths)]
    return StepShape(num_rows=len(rows), num_tokens=sum(fed),
                     num_cached=sum(r.num_cached for r in rows),
                     num_decode_cached=sum(r.num_cached for r, n in zip(rows, fed) if n == 1))

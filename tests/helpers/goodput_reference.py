"""The goodput plan as first written (every candidate prefix's rate computed from scratch), the
reference the incremental ``cascade.core.plan.goodput.plan_pass`` must equal, plan for plan."""

from __future__ import annotations

import math
from collections.abc import Sequence

from cascade.core.plan.goodput import (
    PlanInputs,
    StepCost,
    _shape,
    _slot_value,
    _slots_by_survival,
)


def plan_pass_reference(inputs: PlanInputs, cost: StepCost) -> list[int]:
    """``cascade.core.plan.goodput.plan_pass`` as first written: every candidate prefix's rate
    computed from scratch over every row."""
    rows = inputs.rows
    lengths = [r.num_drafted if not r.is_planned else min(r.floor, r.num_drafted) for r in rows]
    slots = _slots_by_survival(rows, lengths)
    counts = list(lengths)
    best, best_rate = 0, _rate(inputs, counts, cost)
    for taken, (_, r) in enumerate(slots, start=1):
        counts[r] += 1
        rate = _rate(inputs, counts, cost)
        if rate > best_rate:
            best, best_rate = taken, rate
    for _, r in slots[:best]:
        lengths[r] += 1
    return lengths


def _rate(inputs: PlanInputs, counts: Sequence[int], cost: StepCost) -> float:
    """Expected committed tokens per second of verifier time with ``counts`` slots per row.

    A drafting row's next block comes back after its round trip (``wait_s``). While some row
    is ready at once (decoded alone) the verifier goes on without it, and the row misses the
    steps that pass meanwhile; with every row drafting the verifier idles until the first block
    is back, and rows slower than that miss steps too. A row's round counts its tokens spread
    over 1 + the steps it misses."""
    rows = inputs.rows
    seconds = cost.predict(_shape(rows, counts))
    waits = [r.wait_s + n * r.draft_token_s for r, n in zip(rows, counts)]
    drafting = [w for r, n, w in zip(rows, counts, waits) if n and r.is_planned]
    ready = any(n == 0 for n in counts)
    idle = 0.0 if ready or not drafting else min(drafting)
    cycle = seconds + idle
    tokens = 0.0
    for row, n, wait in zip(rows, counts, waits):
        if not row.is_planned:
            tokens += 1 + sum(row.survival[:n])
            continue
        got = 1 + sum(_slot_value(row, i) for i in range(n))
        if n:
            missed = math.ceil(max(0.0, wait - idle) / cycle)
            got /= 1 + (max(1, missed) if ready else missed)
        tokens += got
    return tokens / cycle

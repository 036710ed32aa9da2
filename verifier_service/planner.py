"""The verifier's draft planner: each step, how much of each planned session's block to verify,
and how much each drafter should draft next (the "auto" schedule; cascade.core.goodput).

It lives on the verifier because only the verifier sees a step whole: which sessions share
the pass, what the pass costs (its step-cost model, profiled at start-up and refined from every
real step), and every session's acceptance as it is decided. It plans in two moves:

- **Now**: a block may carry more drafted tokens than pay at this step's load; the pass takes
  the prefix that does (``plan_pass``), which changes no output (greedy output is the target's
  whatever the length, and sampling stays exact for any prefix: each token was drawn from its
  own q).
- **Next**: each verdict tells the drafter how many tokens to draft next: one more than this
  step took (so a length can grow a token a round), or 0 — the drafter then sends empty blocks
  and the verifier decodes the session alone. A session at 0 is *probed* every ``probe_every``
  rounds with a short block (verified whatever it costs) so a drafter that starts paying again
  is noticed; a probe that does not pay doubles the interval (up to ``max_probe_every``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cascade.core.blocks import Draft, RoundOutcome
from cascade.core.goodput import PlanInputs, RowPlan, StepCost, plan_pass
from cascade.core.step_cost import ProfileGrid, StepCostModel, StepShape, load_or_profile
from cascade.core.survival import SurvivalBook
from cascade.serving import metrics

PROBE_TOKENS = 2
"""Drafted tokens a probe asks for (the first positions carry most of a block's value)."""
IDLE_WEIGHT = 0.2
"""Weight of one step in the moving averages of the verifier's idle time and share."""
PROFILE_SECONDS = 6.0
"""Budget of the start-up profile of the pass time (once per model, dtype and machine)."""


def profile_for(runner, seconds: float = PROFILE_SECONDS) -> StepCostModel:
    """The target's step-cost model: cached under the user cache (``$XDG_CACHE_HOME``), else
    profiled now, in about ``seconds``."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    grid = ProfileGrid()
    room = runner.max_length - max(grid.tokens)  # short-context models: shorter caches
    grid = ProfileGrid(cached=tuple(sorted({min(c, room) for c in grid.cached})))
    return load_or_profile(runner, cache / "cascade" / "step-cost", seconds=seconds, grid=grid)


@dataclass
class PlanNote:
    """What the verdict of a planned session's round says about the plan."""

    num_verified: int
    next_draft_tokens: int


@dataclass
class _Planned:
    method: str
    previous: int = 0
    until_probe: int = 0
    """Rounds at 0 left before the next probe (0: not counting)."""
    probe_every: int = 8
    is_probing: bool = False
    note: PlanNote | None = None


class DraftPlanner:
    def __init__(self, cost: StepCost, probe_every: int = 8, max_probe_every: int = 64) -> None:
        self.cost, self.book = cost, SurvivalBook()
        self.probe_every, self.max_probe_every = probe_every, max_probe_every
        self.sessions: dict[int, _Planned] = {}
        """id(sequence) -> its plan state (planned sessions only)."""
        self.idle_s, self.idle_share = 0.0, 0.0

    def enroll(self, sequence, method: str) -> None:
        self.sessions[id(sequence)] = _Planned(method, probe_every=self.probe_every)

    def release(self, sequence) -> None:
        self.sessions.pop(id(sequence), None)
        self.book.forget(id(sequence))

    def note(self, sequence) -> PlanNote | None:
        state = self.sessions.get(id(sequence))
        return state.note if state else None

    def plan(self, items: Sequence[tuple[object, Draft | None]]) -> list[Draft | None]:
        """The drafts the step verifies: planned sessions' blocks cut to what pays."""
        lengths = plan_pass(self._inputs(items, floors=True), self.cost)
        out = []
        for (sequence, draft), n in zip(items, lengths):
            planned = id(sequence) in self.sessions and draft is not None
            out.append(draft.prefix(n) if planned else draft)
        return out

    def observe(self, items: Sequence[tuple[object, Draft | None]], results: Sequence,
                seconds: float, gap_s: float) -> None:
        """After a step (``items``: the drafts it verified): every planned row's acceptance,
        then its next length (a plan of the same rows without probe floors, on the updated
        estimates); the step's real time for the cost model; the wait before it (``gap_s``)."""
        for (sequence, draft), result in zip(items, results):
            state = self.sessions.get(id(sequence))
            if state is None or draft is None or not isinstance(result, RoundOutcome):
                continue
            self.book.observe(id(sequence), state.method, draft.num_tokens, result.num_accepted)
            state.previous = draft.num_tokens
            metrics.PLANNED_DRAFT_TOKENS.observe(draft.num_tokens)
        unforced = plan_pass(self._inputs(items, floors=False), self.cost)
        for (sequence, draft), n in zip(items, unforced):
            state = self.sessions.get(id(sequence))
            if state is not None and draft is not None:
                state.note = PlanNote(draft.num_tokens, self._next_length(state, n))
        if hasattr(self.cost, "observe"):
            self.cost.observe(self.shape(items), seconds)
        self.idle_s += IDLE_WEIGHT * (gap_s - self.idle_s)
        share = gap_s / max(gap_s + seconds, 1e-9)
        self.idle_share += IDLE_WEIGHT * (share - self.idle_share)

    def _inputs(self, items, floors: bool) -> PlanInputs:
        rows = [self._row(sequence, draft, floors) for sequence, draft in items]
        return PlanInputs(rows, self.idle_s, self.idle_share)

    @staticmethod
    def shape(items: Sequence[tuple[object, Draft | None]]) -> StepShape:
        return StepShape(num_rows=len(items),
                         num_tokens=sum(s.pending_tokens(d) for s, d in items),
                         num_cached=sum(len(s.cache.tokens) for s, _ in items))

    def _row(self, sequence, draft: Draft | None, floors: bool) -> RowPlan:
        state = self.sessions.get(id(sequence))
        fed = sequence.pending_tokens(draft)
        cached = len(sequence.cache.tokens)
        if state is None or draft is None:  # verified whole (or a prefill: no draft)
            return RowPlan(0, (), cached, base_tokens=fed, is_planned=False)
        drafted = draft.num_tokens
        survival = self.book.of(id(sequence), state.method).survival(drafted)
        floor = min(PROBE_TOKENS, drafted) if floors and state.is_probing else 0
        return RowPlan(drafted, survival, cached, floor, state.previous,
                       base_tokens=fed - drafted)

    def _next_length(self, state: _Planned, unforced: int) -> int:
        """How many tokens the session's drafter drafts next (see the module docstring)."""
        was_probing, state.is_probing = state.is_probing, False
        if unforced > 0:
            state.until_probe, state.probe_every = 0, self.probe_every
            return unforced + 1
        metrics.PLANNED_ZERO_ROUNDS.inc()
        if was_probing:  # the probe did not pay: wait longer before the next one
            state.probe_every = min(2 * state.probe_every, self.max_probe_every)
        if state.until_probe <= 0:
            state.until_probe = state.probe_every
        state.until_probe -= 1
        if state.until_probe == 0:
            state.is_probing = True
            return PROBE_TOKENS
        return 0

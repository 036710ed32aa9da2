"""The verifier's draft planner: each step, how much of each planned session's block to verify,
and how much each drafter should draft next (the "auto" schedule; cascade.core.plan.goodput).

It lives on the verifier because only the verifier sees a step whole: which sessions share
the pass, what the pass costs (its step-cost model, profiled at start-up and refined from every
real step), and every session's acceptance as it is decided. It plans in two moves:

- **Now**: a block may carry more drafted tokens than pay at this step's load; the pass takes
  the prefix that does (``plan_pass``), which changes no output (greedy output is the target's
  whatever the length, and sampling stays exact for any prefix: each token was drawn from its
  own q). The block's round trip and drafting are spent by then: its slots pay for their share
  of the pass alone (else a block asked for at the breakeven, its estimate moved a little
  since, is dropped, and the session's way back to drafting with it).
- **Next**: each verdict tells the drafter how many tokens to draft next: what the same pass
  would take if the session's block were as long as its longest yet (its k), on the estimates
  this round updated; or 0 — the drafter then sends nothing and the verifier decodes the
  session alone. A session at 0 is *probed* now and then with a short block
  (``verifier_service.probes``) so a drafter that starts paying again is noticed.
- **Shadows** replace probes where they are exact: while a greedy session is decoded alone its
  drafter, idle otherwise, drafts now and then from a past context of committed tokens and
  sends that *shadow* block; the verifier scores it against the tokens it committed there (a
  greedy draft is accepted exactly while it equals them) and counts it as a round of the
  session's acceptance, at no cost to any pass. A session whose drafter sends shadows
  (``SessionOpen.shadow_drafts``) is not probed: it drafts again when its estimates say
  drafting pays.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cascade.core.blocks import Draft, RoundOutcome
from cascade.core.plan.goodput import PlanInputs, RowPlan, StepCost, plan_pass
from cascade.core.verify.step_cost import StepShape
from cascade.core.plan.survival import SurvivalBook
from cascade.core.accept.tree_accept import shadow_path
from cascade.protocol.methods import SELF_ESTIMATED_METHODS
from cascade.serving import metrics
from verifier_service.probes import MAX_PROBE_TOKENS, ProbeClock, Probes
from verifier_service.round_trips import RoundTrips, Trip


@dataclass
class PlanNote:
    """What the verdict of a planned session's round says about the plan."""

    num_verified: int
    next_draft_tokens: int


def sampling_regime(params, policy) -> str:
    """Which sessions pool their acceptance estimates, beside the drafting method: greedy ones,
    or sampled ones of one acceptance rule and temperature (to a tenth). A sampled session
    accepts far fewer drafts than a greedy one (0.12 against 0.31 per drafted token for SmolLM2
    at T = 0.7, keyed rule): one pool would start it from greedy's rates."""
    if params.is_greedy:
        return "greedy"
    return f"{policy.rule.value} T{params.temperature:.1f}"


@dataclass
class _Planned:
    method: str
    pool: str = ""
    """The key of its pooled acceptance estimates: its method and sampling regime
    (``sampling_regime``)."""
    previous: int = 0
    most: int = 0
    """The longest block the session's drafter has sent (its k, as far as the verifier knows)."""
    trip: Trip = field(default_factory=Trip)
    """Its round trips to its drafter (``verifier_service.round_trips``)."""
    probe: ProbeClock = field(default_factory=ProbeClock)
    is_shadowed: bool = False
    """Its drafter sends shadow blocks while it is decoded alone (it said so at the open, or
    one came): no probes needed."""
    is_tree: bool = False
    """It drafts token trees: its estimates are per node (``SurvivalBook.of_tree``)."""
    ready: int = 0
    """Tokens its drafter said it has ready while decoded alone (``DraftReady``), or the
    length of a self-estimated block that held: the next verdict asks for them (0: none)."""
    is_self_estimated: bool = False
    """Its drafts all carry their own estimates (SELF_ESTIMATED_METHODS): drafted only when
    ready, never probed."""
    note: PlanNote | None = None


class DraftPlanner:
    def __init__(self, cost: StepCost) -> None:
        self.cost, self.book = cost, SurvivalBook()
        self.trips, self.probes = RoundTrips(), Probes(cost)
        self.sessions: dict[int, _Planned] = {}
        """id(sequence) -> its plan state (planned sessions only)."""
        self.awaiting: set[int] = set()
        """id(sequence) of sessions decoded alone while the block they were asked for is on its
        way (catching up): their plan stands until it comes."""

    def enroll(self, sequence, method: str, shadowed: bool = False, tree: bool = False,
               most: int = 0, regime: str = "greedy") -> None:
        """``shadowed``: its drafter sends shadow blocks while it is decoded alone; ``tree``:
        it drafts token trees (its slots are nodes, best first; lengths count nodes); ``most``:
        its longest block (k, or a tree's nodes; 0: unknown); ``regime``: its
        ``sampling_regime``."""
        self.sessions[id(sequence)] = _Planned(
            method, f"{method} {regime}", probe=self.probes.clock(method), is_shadowed=shadowed,
            is_tree=tree, most=most, is_self_estimated=method in SELF_ESTIMATED_METHODS)

    def release(self, sequence) -> None:
        self.sessions.pop(id(sequence), None)
        self.awaiting.discard(id(sequence))
        self.book.forget(id(sequence))

    def await_block(self, sequence) -> None:
        """The session is decoded alone while the block it was asked for is on its way: its plan
        stands, and these rounds are neither its block's arrival nor its acceptance."""
        self.awaiting.add(id(sequence))

    def block_came(self, sequence) -> None:
        """The block the session was awaiting came (``await_block``)."""
        self.awaiting.discard(id(sequence))

    def is_awaiting(self, sequence) -> bool:
        return id(sequence) in self.awaiting

    def is_drafting(self, sequence) -> bool:
        """Whether the session's last verdict asked its drafter for a block."""
        note = self.note(sequence)
        return note is not None and note.next_draft_tokens > 0

    def catches_up(self, sequence) -> bool:
        """Whether the session may be decoded alone while the block it was asked for is on its
        way: a greedy chain whose drafter drafts from tokens alone (its shadows say so; the
        block is then exactly the drafter's continuation of any context it agrees with), asked
        for a block."""
        state = self.sessions.get(id(sequence))
        return (state is not None and state.is_shadowed and not state.is_tree
                and state.note is not None and state.note.next_draft_tokens > 0)

    def note(self, sequence) -> PlanNote | None:
        state = self.sessions.get(id(sequence))
        return state.note if state else None

    def plan(self, items: Sequence[tuple[Any, Draft | None]]) -> list[Draft | None]:
        """The drafts the step verifies: planned sessions' blocks cut to what pays."""
        lengths = plan_pass(self._inputs(items, floors=True), self.cost)
        out = []
        for (sequence, draft), n in zip(items, lengths):
            planned = id(sequence) in self.sessions
            out.append(draft.prefix(n) if planned and draft is not None else draft)
        return out

    def first_length(self, sequence, num_active: int) -> int:
        """The first block's length for a session just opened, planned as one row among
        ``num_active`` decoding rows (the current load) on its method's pooled estimates."""
        state = self.sessions[id(sequence)]
        state.most = state.most or MAX_PROBE_TOKENS  # k unknown: its drafter caps the length
        survival = self._rates(sequence, state).survival(state.most)
        cached = len(sequence.committed)
        mine = RowPlan(state.most, survival, cached,
                       wait_s=self.trips.wait(state.method),
                       draft_token_s=self.trips.waited_per_token(state.method))
        others = [RowPlan(0, (), cached, is_planned=False)] * (num_active - 1)
        length = plan_pass(PlanInputs([mine, *others]), self.cost)[0]
        state.note = PlanNote(0, length or self._next_length(state, 0))
        state.trip.asked_at = time.perf_counter() if state.note.next_draft_tokens else None
        return state.note.next_draft_tokens

    def arrived(self, sequence, now: float) -> None:
        """A session's block reached the scheduler (``RoundTrips.arrived``); a round decoded
        alone while its block is on its way is not that block."""
        state = self.sessions.get(id(sequence))
        if state is not None and not self.is_awaiting(sequence):
            self.trips.arrived(state.method, state.trip, now)

    def drafted(self, sequence, seconds: float, num_tokens: int, predrafted: bool = False
                ) -> None:
        """A session's block came in: its drafter took ``seconds`` for ``num_tokens`` tokens
        (told before the block reaches the scheduler, ``arrived``); ``predrafted``: while the
        round before was verified (the verifier did not wait for that drafting)."""
        state = self.sessions.get(id(sequence))
        if state is not None:
            self.trips.drafted(state.method, state.trip, seconds, num_tokens, predrafted)

    def shadow(self, sequence, base_len: int, tokens: Sequence[int],
               parents: Sequence[int] | None = None) -> int | None:
        """A shadow block: ``tokens`` drafted after the first ``base_len`` committed tokens of a
        greedy session, all of whose positions are committed already (a tree, ``parents``:
        down to its depth). Counted as a round that verified them all (the greedy rule accepts
        a drafted token while it equals the committed one; a tree's walk follows the committed
        tokens); returns the tokens accepted, or None when the session is not planned."""
        state = self.sessions.get(id(sequence))
        if state is None or not tokens:
            return None
        path = shadow_path(tokens, parents, sequence.committed[base_len:])
        if state.is_tree:
            self.book.observe_tree(id(sequence), state.pool, len(tokens), path)
        else:
            self.book.observe(id(sequence), state.pool, len(tokens), len(path))
        state.most = max(state.most, len(tokens))
        state.is_shadowed, state.probe.is_probing, state.probe.until = True, False, 0
        metrics.SHADOW_DRAFT_TOKENS.inc(len(tokens))
        return len(path)

    def ready(self, sequence, num_tokens: int) -> None:
        """The session's drafter has a draft of ``num_tokens`` it expects to pay (the
        speculation memory matched): the next verdict asks for it."""
        state = self.sessions.get(id(sequence))
        if state is not None and num_tokens > 0:
            state.ready = num_tokens

    def observe(self, items: Sequence[tuple[Any, Draft | None]], results: Sequence,
                seconds: float) -> None:
        """After a step (``items``: the drafts it verified): every planned row's acceptance,
        then its next length (a plan of the same rows without probe floors, on the updated
        estimates); the step's real time for the cost model."""
        for (sequence, draft), result in zip(items, results):
            state = self.sessions.get(id(sequence))
            if (state is None or draft is None or not isinstance(result, RoundOutcome)
                    or self.is_awaiting(sequence)):
                continue
            if draft.survival is not None:  # estimated by its drafter: not the session's rates
                state.previous = draft.num_tokens
                held = 2 * result.num_accepted >= draft.num_tokens > 0
                state.ready = draft.num_tokens if held else 0  # a match that holds: ask for
                continue  # the next block of it at once
            judged = result.num_judged(draft.num_tokens)
            if state.is_tree and judged == draft.num_tokens:
                path = result.path if result.path is not None else range(result.num_accepted)
                self.book.observe_tree(id(sequence), state.pool, draft.num_tokens, path)
            elif not state.is_tree:
                self.book.observe(id(sequence), state.pool, judged, result.num_accepted)
            state.previous = draft.num_tokens
            metrics.PLANNED_DRAFT_TOKENS.observe(draft.num_tokens)
        unforced = plan_pass(self._inputs(items, floors=False), self.cost)
        for (sequence, draft), n in zip(items, unforced):
            state = self.sessions.get(id(sequence))
            if state is not None and draft is not None and not self.is_awaiting(sequence):
                state.note = PlanNote(draft.num_tokens, self._next_length(state, n))
                state.trip.asked_at = (time.perf_counter() if state.note.next_draft_tokens
                                       else None)
        if hasattr(self.cost, "observe"):
            self.cost.observe(self.shape(items), seconds)

    def _inputs(self, items, floors: bool) -> PlanInputs:
        rows = [self._row(sequence, draft, floors) for sequence, draft in items]
        return PlanInputs(rows)

    @staticmethod
    def shape(items: Sequence[tuple[Any, Draft | None]]) -> StepShape:
        fed = [(s.pending_tokens(d), len(s.cache.tokens)) for s, d in items]
        return StepShape(num_rows=len(items), num_tokens=sum(n for n, _ in fed),
                         num_cached=sum(c for _, c in fed),
                         num_decode_cached=sum(c for n, c in fed if n == 1))

    def _row(self, sequence, draft: Draft | None, floors: bool) -> RowPlan:
        state = self.sessions.get(id(sequence))
        fed = sequence.pending_tokens(draft)
        cached = len(sequence.cache.tokens)
        if state is None or draft is None:  # verified whole (or a prefill: no draft)
            return RowPlan(0, (), cached, base_tokens=fed, is_planned=False)
        if floors:  # planning this pass, the block has come: its round trip and drafting are
            wait = per_token = 0.0  # spent, so its slots pay for their share of the pass alone
        else:
            wait = self.trips.wait(state.method, state.trip)
            per_token = self.trips.waited_per_token(state.method, state.trip)
        if draft.survival is not None and floors:  # the block's own estimates, this pass only
            return RowPlan(draft.num_tokens, draft.survival, cached, 0, state.previous, wait,
                           base_tokens=fed - draft.num_tokens)
        if draft.survival is None:
            state.most = max(state.most, draft.num_tokens)
        drafted = draft.num_tokens if floors else state.most  # next: as long as it may be
        survival = self._rates(sequence, state).survival(drafted)
        floor = drafted if floors and state.probe.is_probing else 0  # a probe: verified whole
        return RowPlan(drafted, survival, cached, floor, state.previous, wait, per_token,
                       base_tokens=fed - draft.num_tokens)

    def _rates(self, sequence, state: _Planned):
        """The session's acceptance estimate: per position (chains) or per node (trees)."""
        if state.is_tree:
            return self.book.of_tree(id(sequence), state.pool)
        return self.book.of(id(sequence), state.pool)

    def _next_length(self, state: _Planned, unforced: int) -> int:
        """How many tokens the session's drafter drafts next (see the module docstring)."""
        if state.ready:  # its drafter has a draft it expects to pay: ask for it
            ready, state.ready, state.probe.is_probing = state.ready, 0, False
            return ready if state.is_self_estimated else max(unforced, ready)
        if state.is_self_estimated:  # nothing ready: decoded alone until its drafter says so
            state.probe.is_probing = False
            return 0
        if unforced > 0:
            self.probes.paid(state.method, state.probe)
            return unforced
        metrics.PLANNED_ZERO_ROUNDS.inc()
        if state.is_shadowed:  # its shadows keep the estimates current: no probe
            state.probe.is_probing = False
            return 0
        return self.probes.at_zero(state.method, state.probe, state.most)

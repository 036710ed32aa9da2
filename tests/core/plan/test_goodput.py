"""The goodput planner on synthetic cost curves and acceptance: steep passes and poor drafts
give 0, cheap wide passes long drafts, rising load shorter ones; estimates follow acceptance."""

import random

import pytest

from cascade.core.plan.goodput import PlanInputs, RowPlan, plan_pass
from cascade.core.verify.step_cost import StepShape
from cascade.core.plan.survival import AcceptanceRates, SurvivalBook
from goodput_reference import plan_pass_reference


class Linear:
    """A pass costs ``base`` + ``per_token`` per token fed + ``per_row`` per row (seconds)."""

    def __init__(self, base: float, per_token: float, per_row: float = 0.0) -> None:
        self.base, self.per_token, self.per_row = base, per_token, per_row

    def predict(self, shape: StepShape) -> float:
        return self.base + self.per_token * shape.num_tokens + self.per_row * shape.num_rows


def survival(rate: float, n: int) -> list[float]:
    return [rate ** (i + 1) for i in range(n)]


def rows(count: int, rate: float, drafted: int = 8, **fields) -> list[RowPlan]:
    return [RowPlan(drafted, survival(rate, drafted), num_cached=100, **fields)
            for _ in range(count)]


AVX2_FLOAT32 = Linear(0.030, 0.006)  # a 9-token pass costs about 2x a one-token pass
AMX_BFLOAT16 = Linear(0.050, 0.0005)  # a 9-token pass costs about 1.1x


@pytest.mark.parametrize("cost,rate,expected", [
    (AVX2_FLOAT32, 0.08, [0]),  # steep pass cost, poor drafter: verify nothing drafted
    (AMX_BFLOAT16, 0.8, [8]),  # nearly free wide passes, good drafter: the whole block
])
def test_one_session_extremes(cost, rate, expected):
    assert plan_pass(PlanInputs(rows(1, rate)), cost) == expected


def test_longer_drafts_when_the_drafter_is_better():
    lengths = [plan_pass(PlanInputs(rows(1, rate)), AVX2_FLOAT32)[0]
               for rate in (0.3, 0.6, 0.8, 0.95)]
    assert lengths == sorted(lengths) and lengths[0] < lengths[-1]


def test_rising_load_shortens_drafts():
    """Each row's slots cost the same, but with more rows the pass's fixed part is shared and
    a slot must beat a higher rate of tokens per second."""
    cost = Linear(0.030, 0.004)
    per_session = [max(plan_pass(PlanInputs(rows(n, 0.7)), cost)) for n in (1, 4, 16, 32)]
    assert per_session == sorted(per_session, reverse=True)
    assert per_session[0] > per_session[-1]


def test_a_long_round_trip_stops_a_lone_session_drafting():
    """One session: the verifier sits idle for the whole round trip to its drafter, which a
    session decoded alone never makes it wait."""
    near = plan_pass(PlanInputs(rows(1, 0.6, wait_s=0.002)), AVX2_FLOAT32)[0]
    far = plan_pass(PlanInputs(rows(1, 0.6, wait_s=0.2)), AVX2_FLOAT32)[0]
    assert near > 0 and far == 0


def test_with_every_row_drafting_the_verifier_idles_for_the_round_trip():
    """Rows that all draft make the verifier idle until the first block is back: a drafter
    pod that takes a second per block stops drafting however good its drafts; a quick one
    drafts."""
    cost = Linear(0.030, 0.0005)
    assert max(plan_pass(PlanInputs(rows(4, 0.9, wait_s=1.0)), cost)) == 0
    assert min(plan_pass(PlanInputs(rows(4, 0.9, wait_s=0.002)), cost)) > 0


def test_among_rows_decoded_alone_a_drafting_row_pays_for_the_steps_it_misses():
    """Three rows decode alone; the fourth's round trip makes it miss the next step, so its
    round must commit more than two steps alone would: a mediocre drafter does not, however
    cheap the wider pass, and a good one does."""
    decoding = [RowPlan(0, (), 100, is_planned=False)] * 3

    def planned(rate):
        row = RowPlan(8, survival(rate, 8), 100, wait_s=0.002)
        return plan_pass(PlanInputs([row, *decoding]), AMX_BFLOAT16)[0]

    assert planned(0.5) == 0 and planned(0.9) > 0


def test_a_slow_drafter_drafts_shorter_blocks():
    """A lone session waits for its drafter's tokens one by one: the slower each drafted
    token, the fewer of them pay, though pass and acceptance are the same."""
    def planned(per_token):
        row = RowPlan(8, survival(0.8, 8), 100, wait_s=0.002, draft_token_s=per_token)
        return plan_pass(PlanInputs([row]), AMX_BFLOAT16)[0]

    lengths = [planned(s) for s in (0.0, 0.01, 0.03, 0.2)]
    assert lengths == sorted(lengths, reverse=True) and lengths[0] > lengths[2]
    assert lengths[-1] == 0


def test_floors_unplanned_rows_and_the_block_bound_are_kept():
    probe = RowPlan(4, survival(0.1, 4), 100, floor=2)
    fixed = RowPlan(3, survival(0.1, 3), 100, is_planned=False, base_tokens=4)
    short = RowPlan(2, survival(0.99, 2), 100)
    assert plan_pass(PlanInputs([probe, fixed, short]), AMX_BFLOAT16) == [2, 3, 2]


def test_hysteresis_keeps_a_length_that_only_just_pays():
    """A slot whose value sits within the hysteresis margin of the rate is kept by a row that
    had it, and not added by a row that did not."""
    cost = Linear(0.030, 0.006)
    rate = next(r / 100 for r in range(1, 100) if plan_pass(
        PlanInputs(rows(1, r / 100, drafted=1)), cost)[0] == 1)  # just pays, previous = 0
    below = rate - 0.01
    had = plan_pass(PlanInputs(rows(1, below, drafted=1, previous=1)), cost)
    fresh = plan_pass(PlanInputs(rows(1, below, drafted=1, previous=0)), cost)
    assert had == [1] and fresh == [0]


def test_acceptance_rates_follow_what_rounds_observe():
    rates = AcceptanceRates(weight=0.5)
    rates.observe(num_verified=4, num_accepted=1)  # position 1 accepted, 2 rejected
    assert rates.rates[0] == pytest.approx(0.75) and rates.rates[1] == pytest.approx(0.25)
    assert rates.rates[2] == pytest.approx(0.5)  # not reached: unchanged
    assert rates.survival(2) == pytest.approx([0.75, 0.75 * 0.25])
    rates.observe(num_verified=0, num_accepted=0)  # nothing verified: nothing learnt
    assert rates.num_rounds == 1


def test_a_new_session_starts_from_its_methods_pooled_estimate():
    book = SurvivalBook()
    for _ in range(200):
        book.observe("old", "ngram", 2, 2)
    assert book.of("new", "ngram").survival(1)[0] > 0.9
    assert book.of("other", "model").survival(1)[0] == pytest.approx(0.5)
    book.forget("old")
    assert "old" not in book.sessions


class Jagged:
    """A measured CPU curve's shape: a 2-token pass costs more than a 5-token one."""

    TIMES = {1: 0.037, 2: 0.057, 3: 0.074, 4: 0.056, 5: 0.051}

    def predict(self, shape: StepShape) -> float:
        return self.TIMES.get(shape.num_tokens, 0.051 + 0.004 * (shape.num_tokens - 5))


def test_a_slot_that_does_not_pay_alone_is_taken_with_the_ones_after_it():
    assert plan_pass(PlanInputs(rows(1, 0.75, drafted=4)), Jagged()) == [4]
    assert plan_pass(PlanInputs(rows(1, 0.2, drafted=4)), Jagged()) == [0]


def test_one_lucky_round_moves_a_sessions_estimate_a_little_and_a_run_a_lot():
    book = SurvivalBook()
    for _ in range(100):
        book.observe("pool", "model", 1, 0)  # the method rarely hits
    fresh = book.of("s", "model").survival(1)[0]
    book.observe("s", "model", 1, 1)
    once = book.of("s", "model").survival(1)[0]
    for _ in range(20):
        book.observe("s", "model", 1, 1)
    assert fresh < once < 0.3 < book.of("s", "model").survival(1)[0]


def test_tree_nodes_survive_by_how_often_they_lie_on_the_accepted_path():
    """Node rates count each verified node on the path or not; survival is their running
    minimum (never rising along a best-first tree), and sessions start from the pool."""
    book = SurvivalBook()
    for _ in range(40):
        book.observe_tree("a", "model", 6, [0, 2])  # nodes 0 and 2 accepted, 1, 3-5 not
    survival = book.of_tree("a", "model").survival(6)
    assert survival[0] > 0.9 and survival[1] < 0.1
    assert survival == sorted(survival, reverse=True)  # running minimum
    fresh = book.of_tree("b", "model").survival(3)  # from the pooled rates
    assert fresh[0] > 0.5 and fresh[1] < fresh[0]
    book.forget("a")
    assert "a" not in book.tree_sessions


class Wobbly:
    """A measured-looking CPU curve: not monotone in the tokens fed, decode rows cheaper."""

    def predict(self, shape: StepShape) -> float:
        wobble = (0.004, -0.003, 0.001, 0.0)[shape.num_tokens % 4]
        return (0.03 + 0.004 * shape.num_tokens + 0.001 * shape.num_rows + wobble
                + 2e-6 * (shape.num_cached - shape.num_decode_cached))


def _random_rows(draw: random.Random) -> list[RowPlan]:
    plans = []
    for _ in range(draw.randint(1, 40)):
        drafted = draw.randint(0, 8)
        rate = draw.random()
        plans.append(RowPlan(
            drafted, [max(rate ** (i + 1) - draw.random() * 0.05, 0.0) for i in range(drafted)],
            num_cached=draw.randint(0, 500), floor=draw.choice([0, 0, 0, 1, 2]),
            previous=draw.randint(0, drafted), wait_s=draw.choice([0.0, 0.002, 0.05, 0.3]),
            draft_token_s=draw.choice([0.0, 0.001, 0.01]), is_planned=draw.random() < 0.85,
            base_tokens=draw.choice([1, 1, 1, 2, 40])))
    return plans


def test_the_incremental_plan_equals_the_plan_computed_from_scratch():
    draw = random.Random(5)
    for case in range(400):
        inputs = PlanInputs(_random_rows(draw))
        for cost in (AVX2_FLOAT32, AMX_BFLOAT16, Jagged(), Wobbly()):
            assert plan_pass(inputs, cost) == plan_pass_reference(inputs, cost), case

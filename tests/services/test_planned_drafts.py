"""The "auto" schedule through real gRPC servers: the verifier verifies what pays, cuts blocks
and trees to it, and the output is the target's (probes and shadows:
test_probes_and_shadows.py)."""

import pytest

from cascade.core.blocks import Draft
from cascade.core.verify.engine import VerifyEngine
from cascade.core.verify.verification import SequenceVerifier
from cascade.protocol.settings import SamplingParams
from models import hf_greedy, random_prompts
from verifier_service.planner import DraftPlanner
from verifier_service.probes import MAX_PROBE_TOKENS
from verifier_service.server import build_verifier
from plans import Linear, STEEP, CHEAP, planned_rounds, lone_session

# Plans and speculation here react to measured times: run alone (scripts/test.sh).
pytestmark = pytest.mark.timing


@pytest.mark.parametrize("cost", [STEEP, CHEAP], ids=["steep", "cheap"])
async def test_planned_greedy_output_is_the_targets(gpt2_pair, cost):
    """The target drafts for itself (every draft is accepted): what the plan verifies then
    depends on the pass's cost alone."""
    target, _ = gpt2_pair
    params = SamplingParams(max_new_tokens=40)
    for prompt in random_prompts(2, seed=41):
        rounds = await planned_rounds(target, target, cost, prompt, params)
        assert [t for r in rounds for t in r.tokens] == hf_greedy(target, prompt, 40)
        drafted = [r.stats.num_drafted for r in rounds]
        assert all(len(r.drafted_tokens) == r.stats.num_drafted for r in rounds)
        if cost is STEEP:  # decoded alone but for probes (each verified whatever it costs)
            assert set(drafted) <= set(range(MAX_PROBE_TOKENS + 1))
            assert drafted.count(0) > 0.7 * len(drafted)
        else:  # every drafted token pays; the first rounds' waits are measured while the
            # machine may be busy (a slow one cuts blocks until the averages settle: six
            # rounds on a 2-core AVX2 EPYC), then every block is whole
            assert all(1 <= n <= 4 for n in drafted[:-1])
            assert drafted[-4:-1] == [4, 4, 4], drafted


async def test_a_drafter_that_never_hits_is_dropped_where_a_drafted_token_costs(gpt2_pair):
    """A drafted token costing a tenth of a pass, a drafter never right: after its first
    blocks the session is decoded alone."""
    target, drafter = gpt2_pair  # two random models: no draft is ever accepted
    params = SamplingParams(max_new_tokens=40)
    prompt = random_prompts(1, seed=42)[0]
    rounds = await planned_rounds(target, drafter, Linear(0.02, 0.002), prompt, params)
    assert [t for r in rounds for t in r.tokens] == hf_greedy(target, prompt, 40)
    drafted = [r.stats.num_drafted for r in rounds]
    assert drafted[0] > 0 and drafted[-8:].count(0) >= 6


def test_drafts_shorten_as_sessions_share_the_pass(gpt2_pair):
    """A load ramp on the real engine: with more sessions in each pass (a higher rate of
    tokens per second to beat), the planner verifies fewer drafted tokens per session."""
    target, drafter = gpt2_pair
    cost = Linear(0.02, 0.002)
    mean_lengths = []
    for sessions in (1, 4, 16):
        planner, engine = DraftPlanner(cost), VerifyEngine(target, kv_tokens=4096)
        prompts = random_prompts(sessions, seed=sessions)
        sequences = [SequenceVerifier(target, p, SamplingParams(max_new_tokens=30),
                                      engine=engine) for p in prompts]
        for sequence in sequences:
            planner.enroll(sequence, "model")
        verified = []
        for _ in range(8):
            items = [(s, Draft(hf_greedy(target, s.committed, 6)[:6])) for s in sequences
                     if not s.is_finished]  # perfect drafts: acceptance alone does not limit
            planned = list(zip([s for s, _ in items], planner.plan(items)))
            planner.observe(planned, engine.step(planned), seconds=0.0)
            verified += [d.num_tokens for _, d in planned]
        mean_lengths.append(sum(verified) / len(verified))
        for sequence in sequences:
            sequence.close()
    assert mean_lengths[0] > mean_lengths[1] > mean_lengths[2]


@pytest.mark.parametrize("cost", [STEEP, CHEAP], ids=["steep", "cheap"])
async def test_planned_trees_are_cut_to_what_pays_and_stay_exact(gpt2_pair, cost):
    """A tree session under "auto": its slots are nodes, best first. Where drafted tokens cost
    ten passes the verifier decodes it alone but for probes; where wide passes are free it
    verifies whole trees (the target drafting for itself, so their best paths are accepted)."""
    target, _ = gpt2_pair
    params = SamplingParams(max_new_tokens=40)
    prompt = random_prompts(1, seed=44)[0]
    rounds = await planned_rounds(target, target, cost, prompt, params, k=3, tree_nodes=9)
    assert [t for r in rounds for t in r.tokens] == hf_greedy(target, prompt, 40)
    drafted = [r.stats.num_drafted for r in rounds]
    if cost is STEEP:  # decoded alone; its drafter's shadow trees replace probes
        assert sum(1 for n in drafted if n) <= 1
    else:
        assert max(drafted) == 9 and any(r.drafted_parents for r in rounds)
        # whole paths accepted, in most rounds (the plan, timed on this machine, may cut a few)
        assert sum(r.stats.num_accepted for r in rounds) >= 0.5 * 40


def test_blocks_with_their_own_estimates_are_cut_by_them_and_ask_for_more(gpt2_pair):
    """A block carrying survival estimates (the speculation memory's) is cut where they stop
    paying, leaves the session's measured rates alone, and a block that held asks for the next
    one; a draft-ready note brings a session decoded alone back to drafting."""
    target, _ = gpt2_pair
    planner, engine = DraftPlanner(Linear(0.02, 0.002)), VerifyEngine(target, kv_tokens=1024)
    sequence = SequenceVerifier(target, random_prompts(1, seed=44)[0],
                                SamplingParams(max_new_tokens=60), engine=engine)
    planner.enroll(sequence, "suffix")
    right = hf_greedy(target, sequence.committed, 8)[:8]
    sure = Draft(right, survival=[0.99] * 6 + [0.01] * 2)
    [cut] = planner.plan([(sequence, sure)])
    assert cut.num_tokens == 6 and cut.survival == [0.99] * 6
    rates_before = planner.book.of(id(sequence), planner.sessions[id(sequence)].pool).survival(4)
    planner.observe([(sequence, cut)], engine.step([(sequence, cut)]), seconds=0.0)
    assert planner.book.of(id(sequence), planner.sessions[id(sequence)].pool).survival(4) == rates_before
    assert planner.note(sequence).next_draft_tokens == 6  # it held: the next block, at once
    alone = [(sequence, Draft([]))]
    for _ in range(3):
        planner.observe(alone, engine.step(alone), seconds=0.0)
    assert planner.note(sequence).next_draft_tokens == 0  # nothing ready: decoded alone
    planner.ready(sequence, 5)
    planner.observe(alone, engine.step(alone), seconds=0.0)
    assert planner.note(sequence).next_draft_tokens >= 5
    sequence.close()


def test_the_verifier_reports_whether_its_passes_are_invariant(gpt2_pair):
    from cascade.serving import metrics
    from verifier_service.scheduler import VerifierSettings

    target, _ = gpt2_pair
    build_verifier(target, grace_s=1.0, step_cost=CHEAP,
                   settings=VerifierSettings(kv_tokens=4096, invariant=False))
    assert metrics.VERIFIER_INVARIANT._value.get() == 0
    _, sessions = build_verifier(target, grace_s=1.0, step_cost=CHEAP,
                                 settings=VerifierSettings(kv_tokens=4096))
    assert sessions.engine.invariance_verified  # the probe passed on this machine
    assert metrics.VERIFIER_INVARIANT._value.get() == 1


def test_drafting_done_while_the_round_before_was_verified_is_not_counted_as_waited(gpt2_pair):
    """A session drafting with a fast drafter; then its drafter takes half a second per token.
    Waited for, that never pays; done while the round before was verified (pre-drafts that came
    true), it costs the verifier nothing, and the session goes on drafting."""
    target, _ = gpt2_pair
    asked = {}
    for predrafted in (False, True):
        planner, engine, sequence = lone_session(target, Linear(0.02, 0.002), 45, 90)
        asked[predrafted] = []
        for number in range(18):
            note = planner.note(sequence)
            length = 4 if note is None else note.next_draft_tokens
            draft = hf_greedy(target, sequence.committed, max(length, 1))[:length]
            per_token = 0.0001 if number < 6 else 0.5
            planner.drafted(sequence, per_token * len(draft), len(draft), predrafted)
            planned = list(zip([sequence], planner.plan([(sequence, Draft(draft))])))
            planner.observe(planned, engine.step(planned), seconds=0.0)
            asked[predrafted].append(planner.note(sequence).next_draft_tokens)
        sequence.close()
    assert min(asked[False][2:6] + asked[True][2:6]) >= 3  # a fast drafter: drafting pays
    assert asked[False][8:].count(0) >= 8
    assert min(asked[True][6:]) >= 3


def test_drafts_after_a_stop_among_the_accepted_are_not_judged():
    """A round a stop token among the accepted drafts ended: the drafts after it were never
    judged, so the plan's estimates record no rejection for them (a stop from the verifier's
    own token after a rejection is a rejection)."""
    from types import SimpleNamespace

    from cascade.core.blocks import RoundOutcome
    from cascade.protocol.settings import FinishReason

    planner, stop = DraftPlanner(CHEAP), FinishReason.STOP
    cut, rejected = (SimpleNamespace(committed=[1] * 12, cache=SimpleNamespace(tokens=[1] * 10),
                                     pending_tokens=lambda draft: 5) for _ in range(2))
    for sequence, outcome in ((cut, RoundOutcome(2, [5, 6], 12, stop)),
                              (rejected, RoundOutcome(2, [5, 6, 7], 13, stop))):
        planner.enroll(sequence, "model")
        planner.observe([(sequence, Draft([5, 6, 8, 9]))], [outcome], 0.0)
    assert planner.book.of(id(cut), "model greedy").trials[:3] == [1.0, 1.0, 0.0]
    assert planner.book.of(id(rejected), "model greedy").trials[:3] == [1.0, 1.0, 1.0]


def test_greedy_and_sampled_sessions_of_one_method_pool_apart():
    """A sampled session starts from the sampled sessions' pooled rates, not the greedy ones'
    (they accept far fewer drafts)."""
    from types import SimpleNamespace

    from cascade.core.blocks import RoundOutcome
    from cascade.protocol.settings import SamplingParams
    from cascade.protocol.acceptance import AcceptancePolicy
    from verifier_service.planner import sampling_regime

    greedy, sampled = SamplingParams(temperature=0.0), SamplingParams(temperature=0.7, seed=3)
    assert sampling_regime(greedy, AcceptancePolicy.default_for(greedy)) == "greedy"
    assert sampling_regime(sampled, AcceptancePolicy.default_for(sampled)) == "speculative T0.7"
    planner = DraftPlanner(CHEAP)
    sequences = [SimpleNamespace(committed=[1] * 12, cache=SimpleNamespace(tokens=[1] * 10),
                                 pending_tokens=lambda draft: 5) for _ in range(3)]
    planner.enroll(sequences[0], "model", regime="greedy")
    for _ in range(40):  # greedy rounds that accept every draft
        planner.observe([(sequences[0], Draft([5, 6, 7, 8]))],
                        [RoundOutcome(4, [5, 6, 7, 8, 9], 17)], 0.0)
    planner.enroll(sequences[1], "model", regime="greedy")
    planner.enroll(sequences[2], "model", regime="keyed T0.7")
    learned = planner.book.of(id(sequences[1]), "model greedy").survival(4)
    fresh = planner.book.of(id(sequences[2]), "model keyed T0.7").survival(4)
    assert learned[0] > fresh[0] and learned[-1] > 2 * fresh[-1]

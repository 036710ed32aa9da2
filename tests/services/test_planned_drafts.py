"""The "auto" schedule through real gRPC servers: the verifier verifies what pays, decodes a
session alone when nothing does (probing now and then), and the output is the target's."""

import grpc
import pytest

from cascade.core.blocks import Draft
from cascade.core.verify.engine import VerifyEngine
from cascade.core.verify.step_cost import StepShape
from cascade.core.verify.verification import SequenceVerifier
from cascade.protocol.settings import DraftConfig, SamplingParams
from cascade.protocol.wire.convert import draft_settings_to_pb, sampling_to_pb
from cascade.v1 import drafter_pb2, drafter_pb2_grpc
from drafter_service.server import build_drafter
from models import hf_greedy, random_prompts
from cascade.core.accept.tree_accept import shadow_path
from verifier_service.planner import DraftPlanner
from verifier_service.probes import MAX_PROBE_TOKENS
from verifier_service.server import build_verifier


class Linear:
    def __init__(self, base: float, per_token: float) -> None:
        self.base, self.per_token = base, per_token

    def predict(self, shape: StepShape) -> float:
        return self.base + self.per_token * shape.num_tokens


STEEP = Linear(0.0001, 0.01)  # a pass costs by the token: a drafted token never pays, even
# always accepted (it would save a fixed part of 0.1 ms, less than any round trip)
CHEAP = Linear(0.05, 1e-6)  # wide passes are free: every drafted token pays


async def planned_rounds(target, drafter, cost, prompt, params, k=4, tree_nodes=0):
    verifier, _ = build_verifier(target, grace_s=1.0, step_cost=cost)
    draft_service, _ = build_drafter(drafter, grace_s=1.0)
    await verifier.start()
    await draft_service.start()
    try:
        async with grpc.aio.insecure_channel(draft_service.address) as channel:
            request = drafter_pb2.RunSessionRequest(
                session_id="auto", epoch=1, context_tokens=prompt, prompt_len=len(prompt),
                sampling=sampling_to_pb(params),
                draft=draft_settings_to_pb(DraftConfig(k, planned=True, tree_nodes=tree_nodes)),
                verifier_address=verifier.address)
            stub = drafter_pb2_grpc.DrafterStub(channel)
            return [r async for r in stub.RunSession(request, timeout=60)]
    finally:
        await draft_service.drain()
        await verifier.drain()


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


def lone_session(target, cost, seed: int, max_new_tokens: int, shadowed: bool = False):
    """A planner on ``cost``, an engine of the target and one greedy session enrolled with its
    "model" drafting method."""
    planner, engine = DraftPlanner(cost), VerifyEngine(target, kv_tokens=1024)
    prompt = random_prompts(1, seed=seed)[0]
    sequence = SequenceVerifier(target, prompt, SamplingParams(max_new_tokens=max_new_tokens),
                                engine=engine)
    planner.enroll(sequence, "model", shadowed=shadowed)
    return planner, engine, sequence


def test_a_block_that_came_pays_for_its_pass_alone(gpt2_pair):
    """A round trip of a second makes the next block not pay, but the block already here is
    verified: its drafting and round trip are spent, and its slots cost little of the pass."""
    target, _ = gpt2_pair
    planner, engine, sequence = lone_session(target, Linear(0.02, 0.001), 45, 20)
    planner.trips.wait_s["model"] = 1.0
    items = [(sequence, Draft(hf_greedy(target, sequence.committed, 2)))]
    planned = list(zip([sequence], planner.plan(items)))
    assert planned[0][1].num_tokens == 2
    planner.observe(planned, engine.step(planned), seconds=0.0)
    assert planner.note(sequence).next_draft_tokens == 0
    sequence.close()


def test_a_drafter_that_starts_paying_is_probed_back_in(gpt2_pair):
    """Wrong drafts take a session to 0; once its drafts turn right, the next probe notices
    and the session drafts again, growing a token a round."""
    target, _ = gpt2_pair
    planner, engine, sequence = lone_session(target, Linear(0.02, 0.002), 43, 120)
    asked = []
    for number in range(70):
        note = planner.note(sequence)
        length = 4 if note is None else note.next_draft_tokens
        right = hf_greedy(target, sequence.committed, max(length, 1))[:length]
        draft = right if number >= 30 else [(t + 1) % 96 for t in right]
        items = [(sequence, Draft(draft))]
        planned = list(zip([sequence], planner.plan(items)))
        planner.observe(planned, engine.step(planned), seconds=0.0)
        asked.append(planner.note(sequence).next_draft_tokens)
    sequence.close()
    assert asked[25:30].count(0) >= 4  # wrong drafts: decoded alone
    assert max(asked[30:]) >= 3 and asked[-1] >= 3  # probed back in, grown again


def test_probes_are_the_cheapest_pass_and_back_off_for_the_method():
    """A probe asks for the draft length whose pass costs least (measured CPU passes are not
    monotone), and a failed probe makes the next session of the method wait longer too."""
    from verifier_service.planner import _Planned
    from verifier_service.probes import ProbeClock

    jagged = {2: 0.057, 3: 0.074, 4: 0.056, 5: 0.051}
    planner = DraftPlanner(type("Cost", (), {"predict": lambda self, shape: jagged.get(
        shape.num_tokens, 0.03)})())
    state = _Planned("model", most=4, probe=ProbeClock(every=2))
    assert planner.probes.length(state.most) == 4
    lengths = [planner._next_length(state, 0) for _ in range(3)]
    assert lengths == [0, 4, 0] and state.probe.is_probing is False
    assert planner.probes.pooled["model"] == 16  # 8 doubled by the failed probe
    assert planner.probes.clock("model").every == 16  # the method's next session waits longer
    assert planner._next_length(state, 3) == 3
    assert planner.probes.pooled["model"] == 8


def test_shadows_replace_probes_and_bring_a_session_back(gpt2_pair):
    """A shadowed session at 0 is never probed while its shadows miss; once they hit, its
    next verdict asks for drafts again, with no probe round in between."""
    target, _ = gpt2_pair
    planner, engine, sequence = lone_session(target, Linear(0.02, 0.002), 44, 120,
                                             shadowed=True)
    asked, shadows = [], []
    for number in range(60):
        note = planner.note(sequence)
        length = 4 if note is None else note.next_draft_tokens
        right = hf_greedy(target, sequence.committed, max(length, 1))[:length]
        draft = right if number >= 40 else [(t + 1) % 96 for t in right]
        planned = list(zip([sequence], planner.plan([(sequence, Draft(draft))])))
        planner.observe(planned, engine.step(planned), seconds=0.0)
        asked.append(planner.note(sequence).next_draft_tokens)
        base = len(sequence.committed) - 4
        if number >= 8 and length == 0 and number % 4 == 0:
            shadow = sequence.committed[base:]
            if number < 40:
                shadow = [(t + 1) % 96 for t in shadow]
            shadows.append(planner.shadow(sequence, base, shadow))
    sequence.close()
    first_zero = asked.index(0)
    stalled = asked[first_zero:40]
    assert stalled == [0] * len(stalled)  # wrong shadows: never probed
    assert 0 in shadows and 4 in shadows
    assert max(asked[40:]) >= 3  # right shadows brought it back


async def test_a_greedy_session_decoded_alone_sends_shadows_not_probes(gpt2_pair):
    """Through the services, a pass cost under which the pair's drafts do not pay: the
    verifier decodes the session alone from its first round and never probes it; the drafter's
    shadow blocks reach the verifier's plan; the output is the target's. (With the target as
    its own drafter, one drafted token would pay under any linear cost once its tail tokens
    show it always accepted, as long as the round trip costs less than a pass's fixed part.)"""
    from cascade.serving import metrics

    target, drafter = gpt2_pair
    params = SamplingParams(max_new_tokens=40)
    prompt = random_prompts(1, seed=45)[0]
    before = metrics.SHADOW_DRAFT_TOKENS._value.get()
    rounds = await planned_rounds(target, drafter, STEEP, prompt, params)
    assert [t for r in rounds for t in r.tokens] == hf_greedy(target, prompt, 40)
    assert [r.stats.num_drafted for r in rounds] == [0] * len(rounds)
    assert metrics.SHADOW_DRAFT_TOKENS._value.get() - before >= 4 * 2  # one per 16 tokens


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


def test_a_shadow_tree_is_scored_by_the_greedy_walk_over_the_committed_tokens():
    truth = [5, 6, 7, 8]
    # root children 9 and 5; 5's children 6 and 1; 6's child 7: the path follows 5, 6, 7
    assert shadow_path([9, 5, 6, 1, 7], [-1, -1, 1, 1, 2], truth) == [1, 2, 4]
    assert shadow_path([5, 6, 9], None, truth) == [0, 1]  # a chain
    assert shadow_path([5, 6], [-1, 0], truth[:1]) == [0]  # past the truth nothing matches


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


async def test_a_shadow_chain_is_cut_to_the_committed_positions():
    """A chain drafted past k (positions a grammar forces come on top of k) is sent with its
    first k tokens: a shadow may only reach positions already committed."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from cascade.core.blocks import Draft
    from drafter_service.shadows import Shadows

    sent = []

    async def send(message):
        sent.append(message.shadow)

    with ThreadPoolExecutor(1) as executor:
        shadows = Shadows(lambda context, budget: Draft(list(range(budget + 3))), executor,
                          send, epoch=1, k=4, load=lambda: 1, due=0)
        shadows.after(list(range(20)))
        await asyncio.wait_for(shadows.task, 10)
    assert [(s.base_len, list(s.tokens)) for s in sent] == [(16, [0, 1, 2, 3])]


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


async def test_a_session_sent_to_draft_among_sessions_decoded_alone_misses_no_step(
        gpt2_pair, monkeypatch):
    """While its block is on its way (a link to its drafter slower than half a step), a planned
    greedy session is decoded alone in the steps other sessions keep running, and the block is
    verified from where those rounds leave it: every output stays the target's, the session
    gets tokens in rounds it would have missed, and each drafted round names the tokens it
    verified."""
    import asyncio
    import time

    from cascade.serving import metrics
    from cascade.serving.mesh.delay import LinkDelay
    from cascade.v1 import verifier_pb2, verifier_pb2_grpc

    step = VerifyEngine.step
    monkeypatch.setattr(VerifyEngine, "step", lambda self, items: (time.sleep(0.03),
                                                                   step(self, items))[1])
    target, _ = gpt2_pair
    verifier, _ = build_verifier(target, grace_s=1.0, step_cost=CHEAP)
    draft_service, _ = build_drafter(target, grace_s=1.0, delay=LinkDelay(10.0, seed=1))
    await verifier.start()
    await draft_service.start()
    alone_prompt, prompt = random_prompts(2, seed=46)
    done, caught_before = asyncio.Event(), metrics.CAUGHT_UP_ROUNDS._value.get()

    async def decoded_alone():  # target-only sessions back to back, until the other ends
        outputs = []
        async with grpc.aio.insecure_channel(verifier.address) as channel:
            stub = verifier_pb2_grpc.VerifierStub(channel)
            while not done.is_set():
                request = verifier_pb2.DecodeRequest(session=verifier_pb2.SessionOpen(
                    session_id=f"alone-{len(outputs)}", epoch=1, context_tokens=alone_prompt,
                    prompt_len=len(alone_prompt),
                    sampling=sampling_to_pb(SamplingParams(max_new_tokens=30))))
                outputs.append([t async for r in stub.Decode(request, timeout=60)
                                for t in r.tokens])
        return outputs

    async def planned():
        await asyncio.sleep(0.05)  # the other sessions are stepping by then
        async with grpc.aio.insecure_channel(draft_service.address) as channel:
            request = drafter_pb2.RunSessionRequest(
                session_id="auto", epoch=1, context_tokens=prompt, prompt_len=len(prompt),
                sampling=sampling_to_pb(SamplingParams(max_new_tokens=40)),
                draft=draft_settings_to_pb(DraftConfig(4, planned=True)),
                verifier_address=verifier.address)
            stub = drafter_pb2_grpc.DrafterStub(channel)
            try:
                return [r async for r in stub.RunSession(request, timeout=60)]
            finally:
                done.set()

    try:
        alone, rounds = await asyncio.gather(decoded_alone(), planned())
    finally:
        await draft_service.drain()
        await verifier.drain()
    assert alone and all(tokens == hf_greedy(target, alone_prompt, 30) for tokens in alone)
    assert [t for r in rounds for t in r.tokens] == hf_greedy(target, prompt, 40)
    first = next(i for i, r in enumerate(rounds) if r.stats.num_drafted)
    between = [r for r in rounds[first + 1:-1] if not r.stats.num_drafted]
    assert len(between) >= 3 and all(len(r.tokens) == 1 for r in between)
    # most of those rounds were caught up; the rest the plan decoded alone (when the link's
    # wait made a block not pay for a while), which timing decides; a caught-up round is
    # always one without a draft (before the first block or between blocks)
    undrafted = sum(1 for r in rounds if not r.stats.num_drafted)
    assert 3 <= metrics.CAUGHT_UP_ROUNDS._value.get() - caught_before <= undrafted
    drafted = [r for r in rounds if r.stats.num_drafted]
    assert len(drafted) >= 3
    for r in drafted:  # the target drafts for itself: every verified token is accepted
        assert list(r.drafted_tokens) == list(r.tokens[:r.stats.num_drafted])


async def test_a_chain_alone_on_its_pod_sends_its_tail_token_once_its_position_is_committed():
    """Between shadows, a chain session alone on its drafter pod drafts one token at the
    committed tokens' end each round, and sends it as a one-token shadow once the verifier has
    committed that position; with another session on the pod, or a tree, it drafts none."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from cascade.core.blocks import Draft
    from drafter_service.shadows import Shadows

    async def run(load: int, budget: int = 0) -> tuple[list, list]:
        sent, asked = [], []

        async def send(message):
            sent.append((message.shadow.base_len, list(message.shadow.tokens)))

        def propose(context, num_tokens):
            asked.append((len(context), num_tokens))
            return Draft([100 + len(context)] * num_tokens)

        with ThreadPoolExecutor(1) as executor:
            shadows = Shadows(propose, executor, send, epoch=1, k=4, load=lambda: load,
                              due=1000, budget=budget)
            for length in (10, 11, 13):
                shadows.after(list(range(length)))
                if shadows.task is not None:
                    await asyncio.wait_for(shadows.task, 10)
            await shadows.stop()
        return sent, asked

    sent, asked = await run(load=1)
    assert asked == [(10, 1), (11, 1), (13, 1)]  # one token at the tail, every round
    assert sent == [(10, [110]), (11, [111])]  # each once its position is committed
    assert await run(load=2) == ([], [])
    assert await run(load=1, budget=6) == ([], [])


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

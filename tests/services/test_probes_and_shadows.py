"""A session the "auto" schedule decodes alone: probes now and then, shadow drafts scored
against what the target committed, and the way back to drafting when drafts start to pay."""

import grpc
import pytest

from cascade.core.blocks import Draft
from cascade.core.verify.engine import VerifyEngine
from cascade.protocol.settings import DraftConfig, SamplingParams
from cascade.protocol.wire.convert import draft_settings_to_pb, sampling_to_pb
from cascade.v1 import drafter_pb2, drafter_pb2_grpc
from drafter_service.server import build_drafter
from models import hf_greedy, random_prompts
from cascade.core.accept.tree_accept import shadow_path
from verifier_service.planner import DraftPlanner
from verifier_service.server import build_verifier
from plans import Linear, STEEP, CHEAP, planned_rounds, lone_session

# Plans and speculation here react to measured times: run alone (scripts/test.sh).
pytestmark = pytest.mark.timing


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


def test_a_shadow_tree_is_scored_by_the_greedy_walk_over_the_committed_tokens():
    truth = [5, 6, 7, 8]
    # root children 9 and 5; 5's children 6 and 1; 6's child 7: the path follows 5, 6, 7
    assert shadow_path([9, 5, 6, 1, 7], [-1, -1, 1, 1, 2], truth) == [1, 2, 4]
    assert shadow_path([5, 6, 9], None, truth) == [0, 1]  # a chain
    assert shadow_path([5, 6], [-1, 0], truth[:1]) == [0]  # past the truth nothing matches


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

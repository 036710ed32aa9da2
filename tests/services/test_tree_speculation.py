"""Drafting during verification with token trees, through real gRPC servers on loopback, tiny
models, float32: exact on the hit and the miss path in both modes, hits when the drafter is a
copy of the target, and blocks sent ahead of a tree's verdict matched by the accepted path."""

import grpc
import pytest

from cascade.core.plan.speculation import Outcome
from cascade.core.trees import children
from cascade.core.loop import generate
from cascade.protocol.settings import DraftConfig, SamplingParams
from cascade.protocol.acceptance import AcceptancePolicy, AcceptanceRule
from cascade.protocol.trees import chain_parents
from cascade.protocol.wire.convert import acceptance_to_pb, draft_settings_to_pb, sampling_to_pb
from cascade.serving.mesh.delay import LinkDelay
from cascade.v1 import common_pb2, drafter_pb2, drafter_pb2_grpc, verifier_pb2_grpc
from drafter_service.predrafts import PreDrafter
from drafter_service.server import build_drafter
from drafter_service.speculation import SpeculationConfig
from models import VOCAB_SIZE, hf_greedy, random_prompts
from services.test_drafter_verifier import block_request, open_request
from verifier_service.server import build_verifier

# Plans and speculation here react to measured times: run alone (scripts/test.sh).
pytestmark = pytest.mark.timing

HITS = (common_pb2.SPECULATION_CACHE_HIT, common_pb2.SPECULATION_AHEAD_HIT)


def tree_config(expansion: str = "dynamic") -> DraftConfig:
    return DraftConfig(3, tree_nodes=8, tree_branching=2, tree_expansion=expansion)


@pytest.fixture
async def cluster(gpt2_pair):
    """A verifier of the target, and drafters (of the pair's drafter, or of ``model``) on
    demand; all stopped at the end."""
    target, drafter = gpt2_pair
    verifier, _ = build_verifier(target, grace_s=1.0)
    await verifier.start()
    started = [verifier]

    async def drafter_with(mode, delay_ms=10.0, model=None, **options):
        service, _ = build_drafter(model or drafter, grace_s=1.0,
                                   delay=LinkDelay(delay_ms, seed=1),
                                   speculation=SpeculationConfig(mode, **options))
        await service.start()
        started.append(service)
        return service

    yield verifier, drafter_with
    for service in reversed(started):
        await service.drain()


async def run_tree(drafter, verifier, prompt, config, params=SamplingParams(max_new_tokens=24),
                   policy: AcceptancePolicy | None = None):
    """A tree session's rounds (greedy unless ``params`` sample)."""
    request = drafter_pb2.RunSessionRequest(
        session_id="t1", epoch=1, context_tokens=prompt, prompt_len=len(prompt),
        sampling=sampling_to_pb(params), draft=draft_settings_to_pb(config),
        acceptance=acceptance_to_pb(policy) if policy else None,
        verifier_address=verifier.address)
    async with grpc.aio.insecure_channel(drafter.address) as channel:
        stub = drafter_pb2_grpc.DrafterStub(channel)
        return [r async for r in stub.RunSession(request, timeout=60)]


def real_outcome(expected: list[int], base: list[int], drafted: list[int],
                 parents: list[int] | None) -> Outcome:
    """The outcome greedy verification gives: the path of nodes carrying the target's
    tokens, then its next one."""
    kids, path, node = children(parents or chain_parents(len(drafted))), [], -1
    while True:
        wanted = expected[len(base) + len(path)]
        node = next((c for c in kids[node + 1] if drafted[c] == wanted), None)
        if node is None:
            return Outcome(len(path), wanted, tuple(path) if parents else ())
        path.append(node)


def oracle(target, prompt, wrong_first: bool):
    """Guesses that know the target's greedy continuation: the real outcome after a wrong one
    (a hit), or a wrong one only (a miss)."""
    expected = prompt + hf_greedy(target, prompt, 40)

    async def guesses(self, method, base, drafted, parents=None):
        real = real_outcome(expected, base, drafted, parents)
        wrong = Outcome(real.num_accepted, (real.next_token + 1) % VOCAB_SIZE, real.path)
        return [wrong, real] if wrong_first else [wrong]

    return guesses


@pytest.mark.parametrize("mode", ["cache", "ahead"])
@pytest.mark.parametrize("path", ["hit", "miss"])
async def test_forced_tree_hits_and_misses_stay_exact(cluster, gpt2_pair, monkeypatch, mode,
                                                      path):
    verifier, drafter_with = cluster
    target, _ = gpt2_pair
    prompt = random_prompts(1, seed=81)[0]
    monkeypatch.setattr(PreDrafter, "_guesses", oracle(target, prompt, path == "hit"))
    # the target drafts (its paths are accepted, so guesses name them); time to pre-draft both
    far = await drafter_with(mode, delay_ms=25.0, model=target, send_ahead=2)
    rounds = await run_tree(far, verifier, prompt, tree_config())
    assert [t for r in rounds for t in r.tokens] == hf_greedy(target, prompt)
    assert all(r.path for r in rounds[:-1]), [list(r.path) for r in rounds]
    later = [r.stats.speculation for r in rounds[1:]]
    if path == "miss":
        assert set(later) == {common_pb2.SPECULATION_MISS}
    elif mode == "cache":  # a busy machine may let one verdict land before its pre-draft
        assert later.count(HITS[0]) >= len(later) - 1, later
    else:  # after an ahead hit the verifier answers the next block at once (it was there
        # already), which may leave less than the two trees' pre-drafting: that round misses
        assert set(later) <= {HITS[1], common_pb2.SPECULATION_MISS}, later
        assert later.count(HITS[1]) >= len(later) // 2 + 1, later


@pytest.mark.parametrize("expansion", ["dynamic", "confidence"])
@pytest.mark.parametrize("mode", ["cache", "ahead"])
async def test_greedy_tree_sessions_with_speculation_equal_target_greedy(
        cluster, gpt2_pair, expansion, mode):
    verifier, drafter_with = cluster
    target, _ = gpt2_pair
    far = await drafter_with(mode, send_ahead=3, max_blocks=6)
    for prompt in random_prompts(2, seed=82):
        rounds = await run_tree(far, verifier, prompt, tree_config(expansion))
        assert [t for r in rounds for t in r.tokens] == hf_greedy(target, prompt)
        assert {r.stats.speculation for r in rounds[1:]} <= {common_pb2.SPECULATION_MISS, *HITS}
        assert all(r.drafted_parents for r in rounds[:-1] if r.stats.num_drafted > 1)  # trees


async def test_a_drafter_that_is_the_target_hits_its_tree_guesses(cluster, gpt2_pair):
    """The drafter's own ranking (no oracle): with the target as the drafter every path it
    likes best is accepted and the bonus token is its own top choice after the deepest node."""
    verifier, drafter_with = cluster
    target, _ = gpt2_pair
    same = await drafter_with("ahead", 25.0, model=target, send_ahead=2, max_blocks=4)
    prompt = random_prompts(1, seed=83)[0]
    rounds = await run_tree(same, verifier, prompt, tree_config())
    assert [t for r in rounds for t in r.tokens] == hf_greedy(target, prompt)
    hits = [r for r in rounds[1:] if r.stats.speculation in HITS]
    assert hits and sum(r.stats.num_predrafted for r in rounds) > 0, [r.stats.speculation for r in rounds]


@pytest.mark.parametrize("drafts", ["drafter", "target"])
async def test_keyed_tree_sessions_with_speculation_equal_the_targets_keyed_sampling(
        cluster, gpt2_pair, drafts):
    """Keyed text is a function of the prompt and the seed: the same with pre-drafted trees
    (the target drafting: every guess names a path) as from the target alone."""
    verifier, drafter_with = cluster
    target, _ = gpt2_pair
    far = await drafter_with("ahead", model=target if drafts == "target" else None,
                             send_ahead=2, max_blocks=4)
    keyed = AcceptancePolicy(AcceptanceRule.KEYED)
    params = SamplingParams(temperature=0.8, top_p=0.95, seed=7, max_new_tokens=20)
    prompt = random_prompts(1, seed=86)[0]
    alone = generate(target, prompt, params, None, DraftConfig(num_draft_tokens=0),
                     policy=keyed).tokens
    rounds = await run_tree(far, verifier, prompt, tree_config(), params, keyed)
    assert [t for r in rounds for t in r.tokens] == alone


def tagged_tree(round_number, base_len, outcome: Outcome):
    request = block_request(3, round_number, base_len, [7, 8])
    request.block.parents.extend([-1, -1])
    assumes = request.block.assumes
    assumes.num_accepted, assumes.next_token = outcome.num_accepted, outcome.next_token
    assumes.path.extend(outcome.path)
    return request


async def test_blocks_sent_ahead_of_a_trees_verdict_are_matched_by_the_path(cluster,
                                                                           gpt2_pair):
    verifier, _ = cluster
    target, _ = gpt2_pair
    prompt = random_prompts(1, seed=84)[0]
    greedy = hf_greedy(target, prompt, 2)
    async with grpc.aio.insecure_channel(verifier.address) as channel:
        call = verifier_pb2_grpc.VerifierStub(channel).Verify(timeout=30)
        await call.write(open_request(prompt, epoch=3))
        first_block = block_request(3, 0, len(prompt), [(greedy[0] + 1) % VOCAB_SIZE,
                                                        greedy[0]])
        first_block.block.parents.extend([-1, -1])  # the target's token is node 1
        await call.write(first_block)
        first = await call.read()
        assert list(first.path) == [1] and list(first.tokens) == greedy
        real = Outcome(1, greedy[1], (1,))
        for wrong in (Outcome(1, greedy[1], (0,)),  # another node, as many accepted
                      Outcome(1, greedy[1])):  # no path: a chain's outcome
            await call.write(tagged_tree(1, first.committed_len, wrong))
        await call.write(tagged_tree(1, first.committed_len, real))
        second = await call.read()
        assert second.round == 1 and second.committed_len == first.committed_len + len(
            second.tokens)
        await call.done_writing()


@pytest.mark.parametrize("path, num_accepted, problem", [
    ([3, 1], 2, "increase"), ([70], 1, "below 64"), ([0, 1], 1, "num_accepted")])
async def test_a_hostile_assumed_path_is_refused_naming_the_field(cluster, path, num_accepted,
                                                                   problem):
    verifier, _ = cluster
    prompt = random_prompts(1, seed=85)[0]
    async with grpc.aio.insecure_channel(verifier.address) as channel:
        call = verifier_pb2_grpc.VerifierStub(channel).Verify(timeout=30)
        await call.write(open_request(prompt, epoch=3))
        await call.write(tagged_tree(1, len(prompt), Outcome(num_accepted, 5, tuple(path))))
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await call.read()
        assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "assumes.path" in failure.value.details() and problem in failure.value.details()

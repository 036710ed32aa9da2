"""A feature drafter across real gRPC servers: the target's features travel in verdicts (and in
the replies to SessionOpen) only to sessions that ask, and the output stays exact, also when a
session is restarted elsewhere from its committed tokens."""

import grpc
import pytest
import torch

from cascade.core.blocks import TargetFeatures
from cascade.core.features.feature_runner import FeatureRunner
from cascade.pod.messages import features_from_pb, features_to_pb
from cascade.protocol.settings import DraftConfig, SamplingParams
from cascade.protocol.wire.convert import draft_settings_to_pb, sampling_to_pb
from cascade.v1 import drafter_pb2, drafter_pb2_grpc, verifier_pb2, verifier_pb2_grpc
from drafter_service.server import build_drafter
from models import feature_pair, hf_greedy, random_prompts
from verifier_service.server import build_verifier


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    target, target_dir, drafter_dir = feature_pair(tmp_path_factory.mktemp("feature"))
    return target, FeatureRunner.load(drafter_dir, target_dir)


@pytest.fixture
async def services(pair):
    target, drafter = pair
    verifier, _ = build_verifier(target, grace_s=1.0)
    draft_service, _ = build_drafter(drafter, grace_s=1.0)
    await verifier.start()
    await draft_service.start()
    yield verifier, draft_service
    await draft_service.drain()
    await verifier.drain()


async def run(services, context, prompt_len, max_new, k, epoch=1, tree_nodes=0):
    verifier, draft_service = services
    async with grpc.aio.insecure_channel(draft_service.address) as channel:
        request = drafter_pb2.RunSessionRequest(
            session_id="f1", epoch=epoch, context_tokens=context, prompt_len=prompt_len,
            sampling=sampling_to_pb(SamplingParams(max_new_tokens=max_new)),
            draft=draft_settings_to_pb(DraftConfig(k, tree_nodes=tree_nodes)),
            verifier_address=verifier.address)
        stub = drafter_pb2_grpc.DrafterStub(channel)
        return [r async for r in stub.RunSession(request, timeout=60)]


def test_features_round_trip_with_shape_and_dtype():
    features = TargetFeatures(7, torch.randn(3, 10))
    msg = features_to_pb(features)
    assert (msg.start, list(msg.shape), msg.dtype, len(msg.data)) == (7, [3, 10], "float16", 60)
    back = features_from_pb(msg)
    assert back.start == 7 and back.hidden_states.dtype == torch.float32
    torch.testing.assert_close(back.hidden_states, features.hidden_states.half().float())
    msg.shape[:] = [4, 10]
    with pytest.raises(ValueError, match="bytes"):
        features_from_pb(msg)


@pytest.mark.parametrize("k", [1, 4])
async def test_greedy_with_a_feature_drafter_over_grpc_equals_target_greedy(services, pair, k):
    target, _ = pair
    for prompt in random_prompts(2, seed=60 + k):
        rounds = await run(services, prompt, len(prompt), 20, k)
        assert [t for r in rounds for t in r.tokens] == hf_greedy(target, prompt, 20)
        assert sum(r.stats.num_drafted for r in rounds) > 0


async def test_greedy_feature_drafter_trees_over_grpc_equal_target_greedy(services, pair):
    target, _ = pair
    for prompt in random_prompts(2, seed=62):
        rounds = await run(services, prompt, len(prompt), 20, 4, tree_nodes=12)
        assert [t for r in rounds for t in r.tokens] == hf_greedy(target, prompt, 20)
        assert max(r.stats.num_drafted for r in rounds) > 4  # trees, not chains


async def test_a_restarted_session_gets_the_context_features_again_and_stays_exact(services,
                                                                                   pair):
    target, _ = pair
    prompt = random_prompts(1, seed=70)[0]
    expected = hf_greedy(target, prompt, 24)
    first = await run(services, prompt, len(prompt), 24, 3)
    done = [t for r in first[:2] for t in r.tokens]  # as if the drafter died after two rounds
    rest = await run(services, prompt + done, len(prompt), 24, 3, epoch=2)
    assert done + [t for r in rest for t in r.tokens] == expected


async def _open(stub, prompt, layers):
    call = stub.Verify(timeout=30)
    await call.write(verifier_pb2.VerifyRequest(open=verifier_pb2.SessionOpen(
        session_id=f"w{len(layers)}", epoch=1, context_tokens=prompt, prompt_len=len(prompt),
        sampling=sampling_to_pb(SamplingParams(max_new_tokens=8)), feature_layers=layers)))
    return call


async def test_only_a_session_that_asks_receives_features(services, pair):
    verifier, _ = services
    prompt = random_prompts(1, seed=71, min_len=8)[0]
    block = verifier_pb2.VerifyRequest(block=verifier_pb2.DraftBlock(
        session_id="w0", epoch=1, round=0, base_len=len(prompt), tokens=[1, 2]))
    async with grpc.aio.insecure_channel(verifier.address) as channel:
        stub = verifier_pb2_grpc.VerifierStub(channel)
        plain = await _open(stub, prompt, [])
        await plain.write(block)
        assert not (await plain.read()).HasField("features")
        asking = await _open(stub, prompt, [1, 4])
        opened = await asking.read()  # the context's features, before any block
        assert not opened.tokens and opened.features.start == 0
        assert list(opened.features.shape) == [len(prompt) - 1, 2 * 64]
        block.block.session_id = "w2"
        await asking.write(block)
        verdict = await asking.read()
        assert verdict.features.start == len(prompt) - 1
        assert verdict.features.shape[0] == verdict.stats.num_accepted + 1
        plain.cancel()
        asking.cancel()


async def test_a_feature_drafter_speculating_ahead_stays_exact(pair):
    """Pre-drafts after guessed outcomes use the drafter's own predicted features for the
    guessed positions (their target features have not arrived); blocks sent ahead on them."""
    from cascade.serving.mesh.delay import LinkDelay
    from cascade.v1 import common_pb2
    from drafter_service.speculation import SpeculationConfig

    target, drafter = pair
    verifier, _ = build_verifier(target, grace_s=1.0)
    ahead, _ = build_drafter(drafter, grace_s=1.0, delay=LinkDelay(10.0),
                             speculation=SpeculationConfig("ahead", max_blocks=6))
    await verifier.start()
    await ahead.start()
    try:
        rounds = []
        for prompt in random_prompts(2, seed=67):
            rounds = await run((verifier, ahead), prompt, len(prompt), 20, 3)
            assert [t for r in rounds for t in r.tokens] == hf_greedy(target, prompt, 20)
            assert common_pb2.SPECULATION_UNSPECIFIED not in [r.stats.speculation for r in rounds]
            assert sum(r.stats.num_predrafted for r in rounds) > 0
    finally:
        await ahead.drain()
        await verifier.drain()

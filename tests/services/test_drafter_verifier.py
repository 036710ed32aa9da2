"""Drafter and verifier as real gRPC servers on loopback, tiny models, float32."""

import grpc
import pytest

from cascade.protocol.settings import DraftConfig
from cascade.core.loop import generate
from cascade.protocol.settings import SamplingParams
from cascade.v1 import common_pb2, drafter_pb2, drafter_pb2_grpc, verifier_pb2, verifier_pb2_grpc
from cascade.protocol.wire.convert import sampling_to_pb
from drafter_service.server import build_drafter
from models import hf_greedy, random_prompts
from pod_requests import block_request, open_request, run_session
from verifier_service.server import build_verifier


@pytest.fixture
async def services(gpt2_pair):
    target, drafter = gpt2_pair
    verifier, sessions = build_verifier(target, grace_s=1.0)
    draft_service, _ = build_drafter(drafter, grace_s=1.0)
    await verifier.start()
    await draft_service.start()
    yield verifier, draft_service, sessions
    await draft_service.drain()
    await verifier.drain()


@pytest.mark.parametrize("k", [1, 4])
async def test_greedy_over_grpc_equals_target_greedy(services, gpt2_pair, k):
    verifier, draft_service, _ = services
    target, _ = gpt2_pair
    params = SamplingParams(max_new_tokens=24)
    for prompt in random_prompts(3, seed=31):
        rounds = await run_session(draft_service.address, verifier.address, prompt, params, k)
        tokens = [t for r in rounds for t in r.tokens]
        assert tokens == hf_greedy(target, prompt)
        assert rounds[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
        assert rounds[-1].committed_len == len(prompt) + 24


async def test_sampling_over_grpc_equals_in_process_loop(services, gpt2_pair):
    verifier, draft_service, _ = services
    target, drafter = gpt2_pair
    prompt = random_prompts(1, seed=32)[0]
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=5, max_new_tokens=20)
    rounds = await run_session(draft_service.address, verifier.address, prompt, params, 3)
    expected = generate(target, prompt, params, drafter, DraftConfig(3)).tokens
    assert [t for r in rounds for t in r.tokens] == expected


async def test_stale_blocks_change_nothing(services):
    verifier, _, sessions = services
    prompt = random_prompts(1, seed=33)[0]
    async with grpc.aio.insecure_channel(verifier.address) as channel:
        call = verifier_pb2_grpc.VerifierStub(channel).Verify(timeout=30)
        await call.write(open_request(prompt, epoch=3))
        for stale in (block_request(2, 0, len(prompt), [1, 2]),  # old epoch
                      block_request(3, 0, len(prompt) + 1, [1, 2])):  # wrong base_len
            await call.write(stale)
            verdict = await call.read()
            assert verdict.is_stale and verdict.committed_len == len(prompt)
            assert sessions.sessions["s2"].sequence.committed == prompt
        await call.write(block_request(3, 0, len(prompt), [1, 2]))
        fresh = await call.read()
        assert not fresh.is_stale and fresh.committed_len == len(prompt) + len(fresh.tokens)
        await call.write(block_request(3, 0, len(prompt), [1, 2]))  # resent: same verdict again
        assert await call.read() == fresh
        assert len(sessions.sessions["s2"].sequence.committed) == fresh.committed_len
        await call.done_writing()


async def test_older_epoch_cannot_open(services):
    verifier, _, _ = services
    prompt = random_prompts(1, seed=34)[0]
    async with grpc.aio.insecure_channel(verifier.address) as channel:
        stub = verifier_pb2_grpc.VerifierStub(channel)
        newer = stub.Verify(timeout=30)
        await newer.write(open_request(prompt, epoch=5))
        await newer.write(block_request(5, 0, len(prompt), []))
        await newer.read()
        older = stub.Verify(timeout=30)
        await older.write(open_request(prompt, epoch=4))
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await older.read()
        assert failure.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        newer.cancel()


async def test_decode_is_target_only_greedy(services, gpt2_pair):
    verifier, _, _ = services
    target, _ = gpt2_pair
    prompt = random_prompts(1, seed=35)[0]
    async with grpc.aio.insecure_channel(verifier.address) as channel:
        stub = verifier_pb2_grpc.VerifierStub(channel)
        request = verifier_pb2.DecodeRequest(session=open_request(prompt, 1).open)
        request.session.sampling.max_new_tokens = 24
        rounds = [r async for r in stub.Decode(request, timeout=60)]
    assert [t for r in rounds for t in r.tokens] == hf_greedy(target, prompt)
    assert all(r.stats.num_drafted == 0 for r in rounds)


async def test_bad_request_maps_to_invalid_argument(services):
    _, draft_service, _ = services
    async with grpc.aio.insecure_channel(draft_service.address) as channel:
        stub = drafter_pb2_grpc.DrafterStub(channel)
        request = drafter_pb2.RunSessionRequest(session_id="x", context_tokens=[1],
                                                prompt_len=1, verifier_address="127.0.0.1:1")
        request.sampling.top_p = 1.0  # max_new_tokens stays 0: out of range
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            [r async for r in stub.RunSession(request, timeout=10)]
        assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "max_new_tokens" in failure.value.details()


async def test_an_injected_delay_lengthens_every_round_and_changes_no_token(gpt2_pair):
    """A drafter 25 ms from its verifier (one way): each round takes at least the 50 ms round
    trip; the tokens are the same as next door."""
    from cascade.serving.mesh.delay import LinkDelay

    target, drafter = gpt2_pair
    verifier, _ = build_verifier(target, grace_s=1.0)
    far, _ = build_drafter(drafter, grace_s=1.0, delay=LinkDelay(25.0, 5.0, seed=3))
    await verifier.start()
    await far.start()
    try:
        prompt = random_prompts(1, seed=35)[0]
        params = SamplingParams(max_new_tokens=12)
        rounds = await run_session(far.address, verifier.address, prompt, params, 3)
        assert [t for r in rounds for t in r.tokens] == hf_greedy(target, prompt)[:12]
        assert all(r.stats.round_us >= 40_000 for r in rounds)  # 2 x (25 - 5) ms at least
    finally:
        await far.drain()
        await verifier.drain()
    with pytest.raises(ValueError, match=">= 0 ms"):
        LinkDelay(-1.0)


async def test_a_shadow_past_the_committed_tokens_is_refused_naming_the_field(services):
    """A shadow block may only cover committed positions; one reaching past them ends the
    stream with INVALID_ARGUMENT naming shadow.base_len, and one before any open is refused."""
    verifier, _, _ = services
    prompt = random_prompts(1, seed=35)[0]
    async with grpc.aio.insecure_channel(verifier.address) as channel:
        call = verifier_pb2_grpc.VerifierStub(channel).Verify(timeout=30)
        await call.write(open_request(prompt, epoch=1))
        await call.write(verifier_pb2.VerifyRequest(shadow=verifier_pb2.ShadowBlock(
            epoch=1, base_len=len(prompt) - 1, tokens=[1, 2])))
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await call.read()
        assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "shadow.base_len" in failure.value.details()
        call = verifier_pb2_grpc.VerifierStub(channel).Verify(timeout=30)
        await call.write(verifier_pb2.VerifyRequest(shadow=verifier_pb2.ShadowBlock(
            epoch=1, base_len=0, tokens=[1])))
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await call.read()
        assert "SessionOpen" in failure.value.details()


async def test_hostile_trees_are_refused_at_the_verifier_naming_the_field(services):
    """A forward parent, a parent count that is not one per token, too many nodes, an id out of
    range and a tree larger than the generation has room for each end the stream with
    INVALID_ARGUMENT naming the field; a valid tree is verified."""
    verifier, _, _ = services
    prompt = random_prompts(1, seed=36)[0]
    hostile = {"parents[1]": ([5, 6, 7], [-1, 1, 0]),
               "parents:": ([5, 6, 7], [-1, 0]),
               "tokens": ([5] * 65, [-1] * 65),
               "tokens: token ids": ([5, 10**6], [-1, 0]),
               "parents: 11 nodes; at most 10": ([5] * 11, [-1, *range(-1, 9)])}
    async with grpc.aio.insecure_channel(verifier.address) as channel:
        for field, (tokens, parents) in hostile.items():
            call = verifier_pb2_grpc.VerifierStub(channel).Verify(timeout=30)
            await call.write(open_request(prompt, epoch=1))
            block = block_request(1, 0, len(prompt), tokens)
            block.block.parents.extend(parents)
            await call.write(block)
            with pytest.raises(grpc.aio.AioRpcError) as failure:
                await call.read()
            assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT, field
            assert field in failure.value.details(), failure.value.details()
        call = verifier_pb2_grpc.VerifierStub(channel).Verify(timeout=30)
        await call.write(open_request(prompt, epoch=1))
        block = block_request(1, 0, len(prompt), [5, 6, 7])
        block.block.parents.extend([-1, -1, 0])
        await call.write(block)
        verdict = await call.read()
        assert len(verdict.tokens) == len(verdict.path) + 1
        await call.done_writing()



def test_a_shadow_tree_deeper_than_the_committed_tokens_is_refused():
    from cascade.protocol.limits import RequestInvalid
    from cascade.protocol.wire.validation import check_shadow

    tree = verifier_pb2.ShadowBlock(epoch=1, base_len=8, tokens=[1, 2, 3, 4],
                                    parents=[-1, -1, 0, 2])
    check_shadow(tree, 96, 11)  # depth 3 reaches position 11: committed
    with pytest.raises(RequestInvalid, match="shadow.base_len"):
        check_shadow(tree, 96, 10)
    tree.parents[3] = 3
    with pytest.raises(RequestInvalid, match=r"shadow.parents\[3\]"):
        check_shadow(tree, 96, 11)


async def test_prompt_logprobs_come_with_the_first_round_and_out_of_range_is_refused(
        services, gpt2_pair):
    """The drafter relays the verifier's prompt log-probabilities on the first round only
    (the target's own, to 1e-4); 21 alternatives are refused at both pods' ports, naming the
    field."""
    import torch

    verifier, draft_service, _ = services
    target, _ = gpt2_pair
    prompt = random_prompts(1, seed=37)[0]
    params = SamplingParams(max_new_tokens=8, prompt_logprobs=2)
    rounds = await run_session(draft_service.address, verifier.address, prompt, params, 3)
    assert [len(r.prompt_logprobs) for r in rounds] == [len(prompt) - 1] + [0] * (len(rounds) - 1)
    with torch.no_grad():
        logits = target.model(torch.tensor([prompt])).logits[0, :-1]
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(prompt[1:])[:, None])
    got = torch.tensor([[e.logprob] for e in rounds[0].prompt_logprobs])
    assert torch.allclose(got, expected, atol=1e-4)
    async with grpc.aio.insecure_channel(verifier.address) as channel:
        call = verifier_pb2_grpc.VerifierStub(channel).Verify(timeout=30)
        request = open_request(prompt, epoch=1)
        request.open.sampling.prompt_logprobs = 21
        await call.write(request)
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await call.read()
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "prompt_logprobs" in failure.value.details()
    async with grpc.aio.insecure_channel(draft_service.address) as channel:
        request = drafter_pb2.RunSessionRequest(
            session_id="x", context_tokens=prompt, prompt_len=len(prompt),
            sampling=sampling_to_pb(params), verifier_address=verifier.address)
        request.sampling.prompt_logprobs = 21
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            [r async for r in drafter_pb2_grpc.DrafterStub(channel).RunSession(request,
                                                                               timeout=10)]
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "prompt_logprobs" in failure.value.details()

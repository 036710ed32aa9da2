"""Drafting during verification (speculative speculative decoding) through real gRPC servers on
loopback, tiny models, float32: exact on the hit and the miss path, with and without delay; the
verifier drops blocks sent ahead on a wrong guess without changing anything."""

import grpc
import pytest

from cascade.core.speculation import Guess, Outcome
from cascade.protocol.settings import SamplingParams
from cascade.serving.delay import LinkDelay
from cascade.v1 import common_pb2, verifier_pb2, verifier_pb2_grpc
from drafter_service.draft_loop import DraftLoop
from drafter_service.server import build_drafter
from drafter_service.speculation import SpeculationConfig
from models import hf_greedy, random_prompts
from services.test_drafter_verifier import block_request, open_request, run_session
from verifier_service.server import build_verifier

HIT = (common_pb2.SPECULATION_CACHE_HIT, common_pb2.SPECULATION_AHEAD_HIT)


@pytest.fixture
async def cluster(gpt2_pair):
    """Start a verifier and drafters on demand; stop them all at the end."""
    target, drafter = gpt2_pair
    started = []

    async def start(service):
        await service.start()
        started.append(service)
        return service

    verifier, sessions = build_verifier(target, grace_s=1.0)
    await start(verifier)

    async def drafter_with(mode, delay_ms=0.0, **options):
        config = SpeculationConfig(mode, **options)
        service, _ = build_drafter(drafter, grace_s=1.0, delay=LinkDelay(delay_ms, seed=1),
                                   speculation=config)
        return await start(service)

    yield verifier, sessions, drafter_with
    for service in reversed(started):
        await service.drain()


def oracle(target, prompt, wrong_first: bool):
    """A stand-in for the drafter's ranking that knows the target's greedy continuation: the
    real outcome (after a wrong guess when ``wrong_first``), or only wrong ones (a miss)."""
    expected = prompt + hf_greedy(target, prompt, 40)

    async def guesses(self, base, drafted):
        accepted = 0
        while accepted < len(drafted) and drafted[accepted] == expected[len(base) + accepted]:
            accepted += 1
        real = Outcome(accepted, expected[len(base) + accepted])
        wrong = Outcome(accepted, (real.next_token + 1) % 64)
        chosen = [wrong, real] if wrong_first else [wrong]
        return [Guess(1.0, o) for o in chosen]

    return guesses


@pytest.mark.parametrize("mode", ["cache", "ahead"])
@pytest.mark.parametrize("path", ["hit", "miss"])
async def test_forced_hits_and_misses_stay_exact(cluster, gpt2_pair, monkeypatch, mode, path):
    verifier, _, drafter_with = cluster
    target, _ = gpt2_pair
    prompt = random_prompts(1, seed=61)[0]
    monkeypatch.setattr(DraftLoop, "_guesses", oracle(target, prompt, path == "hit"))
    far = await drafter_with(mode, delay_ms=15.0, send_ahead=2)  # time to pre-draft both
    rounds = await run_session(far.address, verifier.address, prompt,
                               SamplingParams(max_new_tokens=24), 4)
    assert [t for r in rounds for t in r.tokens] == hf_greedy(target, prompt)
    later = [r.speculation for r in rounds[1:]]
    if path == "miss":
        assert set(later) == {common_pb2.SPECULATION_MISS}
    else:
        expected = HIT[1] if mode == "ahead" else HIT[0]
        assert later.count(expected) >= len(later) - 1, later
    if mode == "ahead":
        assert all(r.num_sent_ahead >= 1 for r in rounds[:-1])


@pytest.mark.parametrize("delay_ms", [0.0, 10.0])
@pytest.mark.parametrize("k", [1, 4])
async def test_greedy_with_speculation_equals_target_greedy(cluster, gpt2_pair, delay_ms, k):
    verifier, _, drafter_with = cluster
    target, _ = gpt2_pair
    far = await drafter_with("ahead", delay_ms, send_ahead=3, max_blocks=8)
    counts = {}
    for prompt in random_prompts(3, seed=62):
        rounds = await run_session(far.address, verifier.address, prompt,
                                   SamplingParams(max_new_tokens=24), k)
        assert [t for r in rounds for t in r.tokens] == hf_greedy(target, prompt)
        for r in rounds[1:]:
            counts[r.speculation] = counts.get(r.speculation, 0) + 1
    assert set(counts) <= {common_pb2.SPECULATION_MISS, *HIT}


async def test_sampling_with_speculation_equals_in_process_loop(cluster, gpt2_pair):
    """Draft randomness depends on (seed, position) only, so pre-drafted blocks are the blocks
    a lock-step drafter makes: the same tokens as the in-process loop, hits or not."""
    from cascade.core.loop import generate
    from cascade.protocol.settings import DraftConfig

    verifier, _, drafter_with = cluster
    target, drafter = gpt2_pair
    far = await drafter_with("ahead", 10.0, send_ahead=3, max_blocks=8)
    prompt = random_prompts(1, seed=63)[0]
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=7, max_new_tokens=20)
    rounds = await run_session(far.address, verifier.address, prompt, params, 3)
    expected = generate(target, prompt, params, drafter, DraftConfig(3)).tokens
    assert [t for r in rounds for t in r.tokens] == expected


def tagged(round_number, base_len, tokens, num_accepted, next_token, epoch=3):
    request = block_request(epoch, round_number, base_len, tokens)
    request.block.assumes.num_accepted, request.block.assumes.next_token = (num_accepted,
                                                                            next_token)
    return request


async def test_blocks_on_wrong_guesses_are_dropped_and_change_nothing(cluster):
    verifier, sessions, _ = cluster
    prompt = random_prompts(1, seed=64)[0]
    async with grpc.aio.insecure_channel(verifier.address) as channel:
        call = verifier_pb2_grpc.VerifierStub(channel).Verify(timeout=30)
        await call.write(open_request(prompt, epoch=3))
        await call.write(tagged(0, len(prompt), [5], 0, 1))  # no round before it: dropped
        await call.write(block_request(3, 0, len(prompt), [1, 2]))
        first = await call.read()
        assert first.round == 0 and not first.is_stale
        a, t, length = first.num_accepted, first.tokens[-1], first.committed_len
        for wrong in (tagged(1, length, [7], a + 1, t),  # wrong number accepted
                      tagged(1, length, [7], a, (t + 1) % 64),  # wrong token
                      tagged(2, length, [7], a, t),  # not the next round
                      tagged(1, length, [7], a, t, epoch=2)):  # another epoch
            await call.write(wrong)
        await call.write(tagged(1, length, [7, 8], a, t))  # the right guess
        second = await call.read()
        assert (second.round, second.committed_len) == (1, length + len(second.tokens))
        assert sessions.sessions["s2"].sequence.committed == prompt + list(first.tokens) + list(
            second.tokens)
        await call.write(tagged(2, second.committed_len, [9], second.num_accepted + 1,
                                second.tokens[-1]))  # guesses round 1 wrongly: dropped
        await call.write(block_request(3, 2, second.committed_len, []))
        third = await call.read()
        assert third.round == 2 and third.committed_len == second.committed_len + 1
        await call.done_writing()
        assert await call.read() is grpc.aio.EOF

"""Shared prompt prefixes: a new sequence takes the keys and values of the prefix a live one (or,
on a drafter, an ended one) holds instead of feeding it again, and its outcomes are bit for bit
what feeding gives."""

import asyncio
import gc
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from cascade.core.blocks import Draft
from cascade.core.verify.engine import VerifyEngine
from cascade.core.kv.prefix_share import MIN_SHARED, EndedCaches, HeldTokens
from cascade.core.verify.verification import SequenceVerifier
from cascade.protocol.settings import SamplingParams
from models import random_prompts, tiny_llama
from verifier_service.scheduler import StepScheduler, VerifierSettings

GREEDY = SamplingParams(max_new_tokens=12)


def _rounds(engine, target, prompt, drafts, params=GREEDY, scope=""):
    """Each round's outcome and logits for ``drafts`` (one block per round) on ``engine``."""
    sequence = SequenceVerifier(target, prompt, params, engine=engine, prefix_scope=scope)
    seen = []
    for draft in drafts:
        if sequence.is_finished:
            break
        outcome = sequence.verify(draft)
        seen.append((outcome, sequence.last_forward.logits.clone()))
    return sequence, seen


def _same(a, b):
    assert len(a) == len(b)
    for (outcome_a, logits_a), (outcome_b, logits_b) in zip(a, b):
        assert outcome_a == outcome_b
        assert torch.equal(logits_a, logits_b)


@pytest.mark.parametrize("invariant", [True, False])
def test_a_second_sequence_of_the_same_prompt_copies_its_prefix(invariant):
    target = tiny_llama(0)
    prompt = random_prompts(1, seed=2, min_len=40, max_len=40)[0]
    drafts = [Draft([5, 9, 13]), Draft([]), Draft([7, 7])]
    reference = VerifyEngine(target, kv_tokens=1024, invariant=invariant)
    _, alone = _rounds(reference, target, prompt, drafts)
    engine = VerifyEngine(target, kv_tokens=1024, invariant=invariant)
    first, _ = _rounds(engine, target, prompt, drafts[:1])
    assert engine.prefixes.shared_tokens == 0
    second, shared = _rounds(engine, target, prompt, drafts)
    assert engine.prefixes.shared_tokens == len(prompt) - 1  # the last one is fed for its logits
    if invariant:  # a position's numbers depend on the tokens up to it alone
        _same(shared, alone)
    else:
        assert [o for o, _ in shared] == [o for o, _ in alone]
    first.close(), second.close()
    assert engine.store.reserved == 0


def test_only_the_common_part_is_copied_and_only_from_live_sequences():
    target = tiny_llama(0)
    system, a, b = random_prompts(3, seed=5, min_len=20, max_len=20)
    engine = VerifyEngine(target, kv_tokens=1024)
    first, _ = _rounds(engine, target, system + a, [Draft([1])])
    second, shared = _rounds(engine, target, system + b, [Draft([1, 2]), Draft([])])
    assert engine.prefixes.shared_tokens == len(system)
    _, alone = _rounds(VerifyEngine(target, kv_tokens=1024), target, system + b,
                       [Draft([1, 2]), Draft([])])
    _same(shared, alone)
    first.close(), second.close()
    third, _ = _rounds(engine, target, system + a, [Draft([1])])
    assert engine.prefixes.shared_tokens == len(system)  # nothing live; no full block ended
    third.close()


def test_a_short_common_start_is_fed_not_copied():
    target = tiny_llama(0)
    engine = VerifyEngine(target, kv_tokens=1024)
    start = list(range(1, MIN_SHARED))
    first, _ = _rounds(engine, target, start + [40, 41, 42], [Draft([])])
    second, _ = _rounds(engine, target, start + [50, 51, 52], [Draft([])])
    assert engine.prefixes.shared_tokens == 0
    first.close(), second.close()


def test_a_row_that_asks_for_every_positions_features_feeds_them():
    target = tiny_llama(0)
    prompt = random_prompts(1, seed=7, min_len=30, max_len=30)[0]
    engine = VerifyEngine(target, kv_tokens=1024)
    first, _ = _rounds(engine, target, prompt, [Draft([])])
    second = SequenceVerifier(target, prompt, GREEDY, engine=engine)
    second.feature_layers = (1,)
    features = second.prefill_features()
    assert engine.prefixes.shared_tokens == 0
    assert features is not None
    first.close(), second.close()


async def _step_sizes(engine, target, prompts, params=GREEDY, scopes=None):
    """The batch sizes of the steps that verify each prompt's first block, queued at once
    (``scopes``: each sequence's prefix scope; default: one for all)."""
    sizes, step = [], engine.step

    def counting(items):
        sizes.append(len(items))
        return step(items)

    engine.step = counting
    scheduler = StepScheduler(engine, ThreadPoolExecutor(1), VerifierSettings(max_wait_ms=0))
    sequences = [SequenceVerifier(target, p, params, engine=engine,
                                  prefix_scope=scopes[i] if scopes else "")
                 for i, p in enumerate(prompts)]
    outcomes = await asyncio.gather(*(scheduler.submit(s, Draft([3, 4])) for s in sequences))
    for s in sequences:
        s.close()
    return sizes, outcomes


def test_new_sequences_of_one_prompt_wait_one_step_and_copy_it():
    target = tiny_llama(0)
    prompt = random_prompts(1, seed=9, min_len=48, max_len=48)[0]
    other = random_prompts(1, seed=10, min_len=48, max_len=48)[0]
    engine = VerifyEngine(target, kv_tokens=4096)
    sizes, outcomes = asyncio.run(_step_sizes(engine, target, [prompt, prompt, other, prompt]))
    assert sizes == [2, 2]  # the first of the prompt with the other; then its two siblings
    assert engine.prefixes.shared_tokens == 2 * (len(prompt) - 1)
    assert outcomes[0] == outcomes[1] == outcomes[3]


@pytest.mark.parametrize("invariant", [True, False])
def test_a_drafter_cache_copies_the_prefix_another_holds(invariant):
    runner = tiny_llama(1)
    runner.set_invariant(invariant)
    prompt = random_prompts(1, seed=11, min_len=30, max_len=30)[0]
    first = runner.new_cache()
    first.forward_to(prompt + [3, 4])
    partial = runner.new_cache()
    partial.forward_to(prompt[:12] + [9])
    assert runner.shared_tokens == 12  # what it has in common with the first
    before = runner.shared_tokens
    second = runner.new_cache()
    copied = second.forward_to(prompt + [5], num_logits=2).logits
    assert runner.shared_tokens - before == len(prompt) - 1
    del first
    alone = tiny_llama(1)
    alone.set_invariant(invariant)
    reference = alone.new_cache().forward_to(prompt + [5], num_logits=2).logits
    if invariant:
        assert torch.equal(copied, reference)
    else:
        torch.testing.assert_close(copied, reference, rtol=1e-5, atol=1e-5)


def test_sequences_that_score_their_prompt_are_not_held_back():
    """A sequence asking for its prompt's log-probabilities feeds the whole prompt (it needs
    every row), so waiting a step for a sibling's prefix would gain it nothing."""
    target = tiny_llama(0)
    prompt = random_prompts(1, seed=9, min_len=48, max_len=48)[0]
    engine = VerifyEngine(target, kv_tokens=4096)
    scoring = SamplingParams(max_new_tokens=12, prompt_logprobs=1)
    sizes, _ = asyncio.run(_step_sizes(engine, target, [prompt, prompt], scoring))
    assert sizes == [2]
    assert engine.prefixes.shared_tokens == 0


def test_sequences_of_different_scopes_copy_nothing_from_each_other():
    """Two API keys with the same prompt: the second computes it (a copy would make its first
    token come sooner, and the timing would tell it the other key's prompt); the same key
    copies it."""
    target = tiny_llama(0)
    prompt = random_prompts(1, seed=12, min_len=40, max_len=40)[0]
    engine = VerifyEngine(target, kv_tokens=4096)

    def fed(scope):
        sequence = SequenceVerifier(target, prompt, GREEDY, engine=engine, prefix_scope=scope)
        sequence.verify(Draft([]))
        return sequence

    first = fed("key:a")
    other = fed("key:b")
    assert engine.prefixes.shared_tokens == 0
    same = fed("key:a")
    assert engine.prefixes.shared_tokens == len(prompt) - 1
    for sequence in (first, other, same):
        sequence.close()


def test_new_sequences_wait_only_for_a_prefix_of_their_own_scope():
    target = tiny_llama(0)
    prompt = random_prompts(1, seed=9, min_len=48, max_len=48)[0]
    engine = VerifyEngine(target, kv_tokens=4096)
    sizes, _ = asyncio.run(_step_sizes(engine, target, [prompt, prompt], scopes=["a", "b"]))
    assert sizes == [2]  # nothing to wait for: the other's prefix is not its to copy
    assert engine.prefixes.shared_tokens == 0


def test_a_drafter_cache_copies_only_within_its_scope():
    runner = tiny_llama(1)
    prompt = random_prompts(1, seed=13, min_len=30, max_len=30)[0]
    held = runner.new_cache("key:a")
    held.forward_to(prompt + [3])
    runner.new_cache("key:b").forward_to(prompt + [4])
    assert runner.shared_tokens == 0
    runner.new_cache("key:a").forward_to(prompt + [5])
    assert runner.shared_tokens == len(prompt)


def test_a_drafter_cache_takes_the_prefix_an_ended_one_of_its_scope_held():
    runner = tiny_llama(1)
    prompt = random_prompts(1, seed=14, min_len=30, max_len=30)[0]
    runner.new_cache("key:a").forward_to(prompt + [3])  # the sequence ends at once
    gc.collect()
    assert runner.ended.positions == len(prompt) + 1
    runner.new_cache("key:b").forward_to(prompt + [4])  # another key's: computed
    assert runner.shared_tokens == 0
    cache = runner.new_cache("key:a")
    taken = cache.forward_to(prompt + [5]).logits
    assert runner.shared_tokens == len(prompt)
    fresh = tiny_llama(1).new_cache().forward_to(prompt + [5]).logits
    torch.testing.assert_close(taken, fresh, rtol=1e-5, atol=1e-5)


def test_ended_caches_keep_the_most_recently_used_within_their_room():
    runner = tiny_llama(1)
    ended = EndedCaches(max_positions=70)
    prompts = random_prompts(3, seed=15, min_len=30, max_len=30)
    for prompt in prompts:
        cache = runner.new_cache("k")
        cache.forward_to(prompt)
        ended.keep("k", HeldTokens(list(cache.tokens)), cache.cache)
    assert [e.tokens for e in ended.of_scope("k")] == prompts[1:]  # the oldest went
    ended.touch(ended.of_scope("k")[0])
    cache = runner.new_cache("k")
    cache.forward_to(prompts[0])
    ended.keep("k", HeldTokens(list(cache.tokens)), cache.cache)
    assert [e.tokens for e in ended.of_scope("k")] == [prompts[1], prompts[0]]
    assert ended.positions == 60 and ended.of_scope("other") == []

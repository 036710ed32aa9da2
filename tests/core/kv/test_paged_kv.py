"""Paged KV: the block allocator, chained prefix keys, cached prefixes across requests (bit-equal
to a fresh prefill in the invariant pass), tenant scopes, and preemption under a small store."""

import pytest
import torch

from cascade.core.blocks import Draft
from cascade.core.verify.engine import VerifyEngine
from cascade.core.kv.kv_store import BLOCK_SIZE, KVShape, KVStore
from cascade.core.verify.paged_cache import Preempted
from cascade.protocol.prefix_keys import block_keys
from cascade.core.verify.verification import SequenceVerifier
from cascade.protocol.settings import SamplingParams
from models import random_prompts, tiny_gemma2, tiny_gpt2, tiny_llama, tiny_mistral
from test_prefix_share import _rounds

SHAPE = KVShape(num_layers=1, num_kv_heads=1, head_dim=2, dtype=torch.float32)


def test_a_growing_table_takes_the_next_block_and_freed_blocks_are_reused_lowest_first():
    store = KVStore(SHAPE, 6 * BLOCK_SIZE + 10)  # rounded down to whole blocks
    assert store.num_blocks == 6 and store.capacity == 6 * BLOCK_SIZE
    a, b = store.new_table(2 * BLOCK_SIZE), store.new_table(BLOCK_SIZE + 1)
    assert a.blocks == [0, 1] and b.blocks == [2, 3]
    assert b.run_start(0, BLOCK_SIZE + 1) == 2 * BLOCK_SIZE
    store.release(a.blocks[0])
    assert store.allocate(3) == 4  # after 3, when free
    assert store.allocate(5) == 0  # 6 does not exist: the lowest free one
    assert store.allocate() == 5 and store.allocate() is None


def test_blocks_are_counted_registered_blocks_stay_cached_and_are_evicted_oldest_first():
    store = KVStore(SHAPE, 3 * BLOCK_SIZE)
    blocks = [store.allocate() for _ in range(3)]
    assert store.allocate() is None and store.held == 3 and store.available == 0
    store.register(blocks[0], b"a")
    store.register(blocks[1], b"b")
    store.hold(blocks[0])  # a second holder
    store.release(blocks[0])
    assert store.is_shared(blocks[0]) and store.lookup(b"a") == blocks[0]
    store.release(blocks[1])
    store.release(blocks[0])
    store.release(blocks[2])
    assert store.held == 0 and store.cached == 2 and store.available == 3
    assert store.allocate() == blocks[2]  # a free block before any cached one
    assert store.allocate() == blocks[1]  # then the least recently released cached one
    assert store.lookup(b"b") is None and store.lookup(b"a") == blocks[0]
    store.hold(blocks[0])  # a cache hit: held again, no longer evictable
    assert store.allocate() is None and store.cached == 0


def test_block_keys_chain_every_earlier_token_and_the_scope():
    tokens = list(range(3 * BLOCK_SIZE + 5))
    keys = block_keys(tokens, "key-a")
    assert len(keys) == 3 and len(set(keys)) == 3  # full blocks only
    assert block_keys(tokens, "key-b")[0] != keys[0]  # another tenant, another chain
    changed = [7] + tokens[1:]
    assert all(x != y for x, y in zip(block_keys(changed, "key-a"), keys))  # chained
    assert block_keys(tokens, "key-a", 1, keys[0]) == keys[1:]  # extended incrementally


def _generate(engine, target, prompt, drafts, scope=""):
    """Greedy rounds of ``drafts`` on ``engine``, then the sequence ends; the outcomes and
    each round's logits."""
    sequence, seen = _rounds(engine, target, prompt, drafts, scope=scope)
    sequence.close()
    return seen


FAMILIES = {"llama": tiny_llama, "gpt2": tiny_gpt2, "mistral": tiny_mistral,
            "gemma2": tiny_gemma2}
CASES = [(family, torch.float32) for family in sorted(FAMILIES)] + [("llama", torch.bfloat16)]


def _target(family: str, dtype: torch.dtype):
    runner = FAMILIES[family](0)
    runner.model.to(dtype)
    return runner


@pytest.mark.parametrize(("family", "dtype"), CASES)
def test_a_cached_prefix_gives_what_a_fresh_prefill_gives_bit_for_bit(family, dtype):
    target = _target(family, dtype)
    prompt = random_prompts(1, seed=3, min_len=2 * BLOCK_SIZE + 9, max_len=2 * BLOCK_SIZE + 9)[0]
    drafts = [Draft([5, 9, 13]), Draft([]), Draft([7, 7])]
    fresh = _generate(VerifyEngine(target, kv_tokens=16 * BLOCK_SIZE), target, prompt, drafts)
    engine = VerifyEngine(target, kv_tokens=16 * BLOCK_SIZE)
    _generate(engine, target, prompt, drafts[:1])  # ended: its full blocks stay cached
    assert engine.store.held == 0 and engine.store.cached >= 2
    before = engine.prefixes.shared_tokens
    cached = _generate(engine, target, prompt, drafts)
    assert engine.prefixes.shared_tokens - before == 2 * BLOCK_SIZE
    for (outcome, logits), (expected, expected_logits) in zip(cached, fresh, strict=True):
        assert outcome == expected and torch.equal(logits, expected_logits)


def test_two_scopes_sending_the_same_prompt_never_take_each_others_blocks():
    target = tiny_llama(0)
    prompt = random_prompts(1, seed=4, min_len=3 * BLOCK_SIZE, max_len=3 * BLOCK_SIZE)[0]
    engine = VerifyEngine(target, kv_tokens=32 * BLOCK_SIZE)
    _generate(engine, target, prompt, [Draft([])], scope="tenant-a")
    _generate(engine, target, prompt, [Draft([])], scope="tenant-b")
    assert engine.prefixes.shared_tokens == 0
    assert engine.prefixes.queried_tokens == 2 * (len(prompt) - 1)
    _generate(engine, target, prompt, [Draft([])], scope="tenant-b")
    assert engine.prefixes.shared_tokens == 2 * BLOCK_SIZE  # its own scope's blocks


def _alone(target, prompt, params) -> list[int]:
    sequence = SequenceVerifier(target, prompt, params,
                                engine=VerifyEngine(target, kv_tokens=8 * BLOCK_SIZE))
    while not sequence.is_finished:
        sequence.verify(Draft([]))
    return sequence.generated


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_many_sequences_in_a_small_store_are_preempted_and_still_exact(dtype):
    target = _target("llama", dtype)
    prompts = random_prompts(6, seed=5, min_len=10, max_len=50)
    params = SamplingParams(max_new_tokens=150)  # up to 4 blocks each, 24 in all
    engine = VerifyEngine(target, kv_tokens=12 * BLOCK_SIZE)
    sequences = [SequenceVerifier(target, p, params, engine=engine) for p in prompts]
    steps = 0
    while any(not s.is_finished for s in sequences):
        results = engine.step([(s, Draft([1, 2][: s.max_draft_len()] if steps % 2 else []))
                               for s in sequences if not s.is_finished])
        assert all(not isinstance(r, Exception) or isinstance(r, Preempted) for r in results)
        for sequence in sequences:
            if sequence.is_finished:  # as the verifier closes a finished session
                sequence.close()
        steps += 1
    assert engine.preemptions > 0
    for sequence, prompt in zip(sequences, prompts, strict=True):
        assert sequence.generated == _alone(target, prompt, params)
    assert engine.store.held == 0

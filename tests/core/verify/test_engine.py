"""The batched engine: one step over many sessions gives each session exactly what it gets
alone, bad rows fail alone, and KV memory is reserved, bounded and given back."""

import gc

import pytest
import torch

from cascade.core.blocks import Draft
from cascade.core.verify.engine import KVBudgetExhausted, VerifyEngine
from cascade.core.forward.invariant import KEY_BLOCK
from cascade.core.kv.kv_budget import available_memory
from cascade.core.kv.kv_store import BLOCK_SIZE
from cascade.core.loop import speculative_rounds
from cascade.core.verify.verification import InvalidDraft, SequenceVerifier
from cascade.protocol.settings import DraftConfig, SamplingParams
from cascade.protocol.acceptance import AcceptancePolicy, AcceptanceRule
from models import random_prompts, tiny_gpt2, tiny_llama

CASES = [  # (k, sampling, policy)
    (4, SamplingParams(max_new_tokens=20), None),
    (2, SamplingParams(temperature=0.8, top_k=20, seed=3, max_new_tokens=16), None),
    (0, SamplingParams(max_new_tokens=12), None),
    (3, SamplingParams(max_new_tokens=18), AcceptancePolicy(AcceptanceRule.CHOW, 0.3)),
    (5, SamplingParams(temperature=1.0, top_p=0.9, seed=8, max_new_tokens=20), None),
]


def _alone(target, drafter, prompt, k, params, policy):
    """Each round's draft and outcome when the session runs by itself."""
    config = DraftConfig(num_draft_tokens=k, method="model")
    return [(draft, outcome) for draft, outcome, _ in
            speculative_rounds(target, prompt, params, drafter, config, policy=policy)]


@pytest.mark.parametrize("make", [tiny_llama, tiny_gpt2])
def test_a_mixed_batch_gives_every_session_what_it_gets_alone(make):
    target, drafter = make(0), make(1, num_layers=1)
    prompts = random_prompts(len(CASES), seed=4, min_len=2, max_len=30)
    alone = [_alone(target, drafter, p, k, s, pol) for p, (k, s, pol) in zip(prompts, CASES)]
    engine = VerifyEngine(target, kv_tokens=2048)
    sequences = [SequenceVerifier(target, p, s, policy=pol or AcceptancePolicy.default_for(s),
                                  engine=engine) for p, (_, s, pol) in zip(prompts, CASES)]
    for round_number in range(max(len(rounds) for rounds in alone)):
        live = [i for i, rounds in enumerate(alone) if round_number < len(rounds)]
        results = engine.step([(sequences[i], alone[i][round_number][0]) for i in live])
        for i, result in zip(live, results):
            assert result == alone[i][round_number][1], f"session {i}, round {round_number}"
    for sequence in sequences:
        assert sequence.is_finished
        sequence.close()
    assert engine.store.reserved == 0


def test_a_bad_row_fails_alone():
    target = tiny_llama(0)
    engine = VerifyEngine(target, kv_tokens=512)
    good = SequenceVerifier(target, [1, 2, 3], SamplingParams(max_new_tokens=8), engine=engine)
    bad = SequenceVerifier(target, [4, 5], SamplingParams(max_new_tokens=8), engine=engine)
    results = engine.step([(bad, Draft([10**6])), (good, Draft([]))])
    assert isinstance(results[0], InvalidDraft)
    assert results[1].committed_len == 4 and len(good.committed) == 4
    assert bad.committed == [4, 5]


def test_context_ids_outside_the_vocabulary_are_refused_before_any_pass():
    target = tiny_llama(0)
    engine = VerifyEngine(target, kv_tokens=512)
    with pytest.raises(ValueError, match="context token ids"):
        SequenceVerifier(target, [1, 2, 10**6], SamplingParams(max_new_tokens=8), engine=engine)
    assert engine.store.reserved == 0


def test_admission_counts_what_a_sequence_needs_now_and_memory_comes_back():
    target = tiny_llama(0)
    engine = VerifyEngine(target, kv_tokens=3 * BLOCK_SIZE + 10, invariant=False)
    long = SamplingParams(max_new_tokens=2 * BLOCK_SIZE)  # a worst case of 3 blocks each
    first = SequenceVerifier(target, [1] * 10, long, engine=engine)
    second = SequenceVerifier(target, [2] * 10, long, engine=engine)
    with pytest.raises(KVBudgetExhausted, match="cannot take"):  # 1 promised + 1 growth each
        SequenceVerifier(target, [3] * 5, long, engine=engine)
    assert first.verify(Draft([])).committed_len == 11
    assert engine.store.reserved == BLOCK_SIZE  # what it holds, not its max_tokens
    with pytest.raises(KVBudgetExhausted, match="whole KV budget") as never:
        SequenceVerifier(target, [3] * 5, SamplingParams(max_new_tokens=3 * BLOCK_SIZE),
                         engine=engine)
    assert never.value.never_fits
    first.close()
    first.close()  # idempotent
    third = SequenceVerifier(target, [3] * 5, long, engine=engine)
    assert third.verify(Draft([])).committed_len == 6
    third.close()
    del second  # garbage collection gives the blocks back too
    gc.collect()
    assert engine.store.reserved == 0


def test_fresh_blocks_of_the_invariant_store_have_zeroed_values():
    target = tiny_llama(0)
    engine = VerifyEngine(target, kv_tokens=3 * BLOCK_SIZE)
    engine.store.values.fill_(float("nan"))  # whatever an earlier tenant left
    sequence = SequenceVerifier(target, [5] * (BLOCK_SIZE + 1), SamplingParams(max_new_tokens=4),
                                engine=engine)
    sequence.verify(Draft([]))
    blocks = sequence.cache.table.blocks
    assert len(blocks) == 2 and engine.store.reserved == 2 * BLOCK_SIZE
    for block in blocks:
        span = slice(block * BLOCK_SIZE, (block + 1) * BLOCK_SIZE)
        assert torch.isfinite(engine.store.values[:, :, span]).all()
    unwritten = slice(blocks[1] * BLOCK_SIZE + 1, (blocks[1] + 1) * BLOCK_SIZE)  # past the 65 fed
    assert torch.count_nonzero(engine.store.values[:, :, unwritten]) == 0


def test_the_default_budget_respects_a_container_memory_limit(tmp_path):
    (tmp_path / "memory.max").write_text("1000000\n")
    (tmp_path / "memory.current").write_text("400000\n")
    assert available_memory(tmp_path) <= 600_000
    (tmp_path / "memory.max").write_text("max\n")  # no limit: the machine's memory counts
    assert available_memory(tmp_path) > 600_000


def test_batched_speculative_sampling_emits_each_rows_own_target_distribution():
    """Rows with different settings share every step; each row's first emitted token follows
    the target distribution under its own settings (lossless sampling, batched)."""
    from cascade.core.sample.sampling import process_logits
    from distributions import assert_matches

    target = tiny_llama(0)
    prompt = [3, 14, 15, 92, 65]
    groups = {"t1": SamplingParams(temperature=1.0, max_new_tokens=3),
              "t07p": SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=3)}
    logits = target.new_cache().extend(prompt, 1).logits[0]
    vocab = logits.shape[-1]
    q = torch.softmax(torch.randn(2, vocab, generator=torch.Generator().manual_seed(1)), -1)
    drafted = torch.multinomial(q, 4000, replacement=True,
                                generator=torch.Generator().manual_seed(2))  # [2, 4000]
    engine = VerifyEngine(target, kv_tokens=1000 * KEY_BLOCK)
    firsts: dict[str, list[int]] = {name: [] for name in groups}
    for start in range(0, 4000, 500):
        items = []
        for i in range(start, start + 500):
            name = "t1" if i % 2 else "t07p"
            params = SamplingParams(**{**groups[name].__dict__, "seed": i})
            sequence = SequenceVerifier(target, prompt, params, engine=engine)
            draft = Draft(drafted[:, i].tolist(), torch.arange(vocab).expand(2, vocab), q.float())
            items.append((name, sequence, draft))
        results = engine.step([(s, d) for _, s, d in items])
        for (name, sequence, _), outcome in zip(items, results):
            firsts[name].append(outcome.tokens[0])
            sequence.close()
    for name, params in groups.items():
        assert_matches(torch.tensor(firsts[name]), process_logits(logits, params).double())
    assert engine.store.reserved == 0


def test_a_failed_pass_leaves_every_cache_as_it_was(monkeypatch):
    import cascade.core.verify.engine as engine_module

    target = tiny_llama(0)
    engine = VerifyEngine(target, kv_tokens=512)
    params = SamplingParams(max_new_tokens=8)
    sequence = SequenceVerifier(target, [1, 2, 3], params, engine=engine)
    reference = SequenceVerifier(target, [1, 2, 3], params, engine=engine)
    first = sequence.verify(Draft([]))
    cached = list(sequence.cache.tokens)

    def broken(*args, **kwargs):
        raise RuntimeError("device lost")

    monkeypatch.setattr(engine_module, "packed_forward", broken)
    with pytest.raises(RuntimeError):
        engine.step([(sequence, Draft([5, 6]))])
    assert sequence.cache.tokens == cached and sequence.committed == [1, 2, 3, *first.tokens]
    monkeypatch.undo()
    assert [sequence.verify(Draft([])), sequence.verify(Draft([]))][-1].committed_len == 6
    reference.verify(Draft([]))
    reference.verify(Draft([]))
    reference.verify(Draft([]))
    assert sequence.committed == reference.committed  # nothing stale was reused

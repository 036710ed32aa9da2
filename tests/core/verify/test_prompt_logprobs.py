"""Prompt log-probabilities (``SamplingParams.prompt_logprobs``, ``echo``): the verifier's, from
the pass that first feeds the prompt, equal the target's own log-softmax over a plain forward
of the prompt, whatever the first block holds and whatever shares the pass; the round's own
outcome is unchanged."""

from dataclasses import replace

import pytest
import torch

from cascade.core.verify import logprobs as core_logprobs
from cascade.core.blocks import Draft, token_logprobs
from cascade.core.verify.engine import VerifyEngine
from cascade.core.verify.verification import SequenceVerifier
from cascade.protocol.settings import SamplingParams
from models import full_forward, random_prompts, tiny_gpt2, tiny_llama

TOP = 3
FIRST_BLOCKS = {  # the first pass: the prompt, then this block
    "target-alone": Draft([]),
    "chain-k4": Draft([7, 11, 13, 17]),
    "tree": Draft([7, 8, 11, 12], parents=[-1, -1, 0, 1]),
}


def reference(target, prompt: list[int]) -> torch.Tensor:
    """[len(prompt) - 1, vocab] the target's log-softmax before each prompt token after the
    first, from one plain forward pass of the prompt."""
    with torch.no_grad():
        logits = full_forward(target.model, prompt).logits[0].float()
    return torch.log_softmax(logits[:-1], dim=-1)


def assert_matches(scored, target, prompt: list[int], top: int = TOP) -> None:
    expected = reference(target, prompt)
    assert len(scored) == len(prompt) - 1
    chosen = expected.gather(-1, torch.tensor(prompt[1:]).unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(torch.tensor([s.logprob for s in scored]), chosen, atol=1e-4)
    best = torch.topk(expected, top, dim=-1)
    got = torch.tensor([s.top_logprobs for s in scored])  # [len - 1, top]
    assert torch.allclose(got, best.values, atol=1e-4)
    assert all(len(s.top_ids) == top for s in scored)


@pytest.mark.parametrize("make", [tiny_llama, tiny_gpt2])
@pytest.mark.parametrize("block", list(FIRST_BLOCKS), ids=list(FIRST_BLOCKS))
def test_the_first_round_scores_the_prompt_as_a_plain_forward_does(make, block):
    target = make(0)
    prompt = random_prompts(1, seed=5, min_len=9, max_len=9)[0]
    params = SamplingParams(max_new_tokens=8, logprobs=2)
    asked = SequenceVerifier(target, prompt, replace(params, prompt_logprobs=TOP))
    plain = SequenceVerifier(target, prompt, params)
    first, alone = asked.verify(FIRST_BLOCKS[block]), plain.verify(FIRST_BLOCKS[block])
    assert_matches(first.prompt_logprobs, target, prompt)
    assert replace(first, prompt_logprobs=None) == alone  # the round itself is unchanged
    assert asked.cache.tokens == plain.cache.tokens
    assert asked.verify(Draft([])).prompt_logprobs is None  # handed out once


def test_a_batched_step_scores_one_prompt_while_other_sequences_share_the_pass():
    target = tiny_llama(0)
    engine = VerifyEngine(target, kv_tokens=1024)
    prompts = random_prompts(3, seed=6, min_len=5, max_len=20)
    params = SamplingParams(max_new_tokens=10)
    running = SequenceVerifier(target, prompts[0], params, engine=engine)
    running.verify(Draft([3, 4]))  # mid-generation: its cache holds its context
    fresh = SequenceVerifier(target, prompts[1], params, engine=engine)
    asked = SequenceVerifier(target, prompts[2], replace(params, prompt_logprobs=5),
                             engine=engine)
    twins = [SequenceVerifier(target, s.committed, params, prompt_len=s.prompt_len)
             for s in (running, fresh)]
    blocks = [Draft([1, 2, 3]), Draft([9, 9]), Draft([4, 5, 6, 7])]
    results = engine.step(list(zip((running, fresh, asked), blocks)))
    assert_matches(results[2].prompt_logprobs, target, prompts[2], top=5)
    for result, twin, block in zip(results, twins, blocks):
        assert result.prompt_logprobs is None
        assert result == twin.verify(block)


def test_a_feature_prefill_scores_the_prompt_and_the_first_round_hands_it_out():
    target = tiny_llama(0)
    prompt = random_prompts(1, seed=7, min_len=12, max_len=12)[0]
    sequence = SequenceVerifier(target, prompt, SamplingParams(max_new_tokens=6,
                                                               prompt_logprobs=TOP))
    sequence.feature_layers = (1, 2)
    features = sequence.prefill_features()
    assert features.hidden_states.shape[0] == len(prompt) - 1
    first = sequence.verify(Draft([5, 6]))
    assert_matches(first.prompt_logprobs, target, prompt)


def test_a_moved_session_and_a_one_token_prompt():
    """Context with generated tokens: the first round already returned the prompt's (none
    now); a prompt of one token has no entry (nothing predicts its token)."""
    target = tiny_llama(0)
    params = SamplingParams(max_new_tokens=6, prompt_logprobs=2)
    moved = SequenceVerifier(target, [4, 5, 6, 7], params, prompt_len=3)
    assert moved.verify(Draft([1])).prompt_logprobs is None
    assert SequenceVerifier(target, [4], params).verify(Draft([1, 2])).prompt_logprobs == ()


def test_chunked_scoring_equals_scoring_every_row_at_once(monkeypatch):
    monkeypatch.setattr(core_logprobs, "CHUNK_ROWS", 4)
    rows = torch.randn(11, 96, generator=torch.Generator().manual_seed(0))
    tokens = torch.randint(0, 96, (11,), generator=torch.Generator().manual_seed(1)).tolist()
    whole = token_logprobs(rows, tokens, 3)
    assert core_logprobs.chunked_logprobs([rows[:5], rows[5:]], tokens, 3) == whole


def test_prompt_logprobs_outside_the_range_are_refused():
    with pytest.raises(ValueError, match="prompt_logprobs must be in"):
        SamplingParams(prompt_logprobs=21)


@pytest.mark.parametrize("block", list(FIRST_BLOCKS), ids=list(FIRST_BLOCKS))
def test_a_long_prompt_is_scored_a_part_at_a_time(monkeypatch, block):
    """A prompt longer than LEADING_CHUNK rows: no pass holds more than that many rows' logits
    (plus the block's), and the entries and the round are what one pass gives."""
    from cascade.core.verify import engine as core_engine

    monkeypatch.setattr(core_logprobs, "LEADING_CHUNK", 8, raising=False)
    kept = []
    forward = core_engine.packed_forward
    monkeypatch.setattr(core_engine, "packed_forward", lambda model, store, feeds, keep,
                        *args, **kwargs: (kept.append(len(keep)),
                                          forward(model, store, feeds, keep, *args,
                                                  **kwargs))[1])
    target = tiny_llama(0)
    prompt = random_prompts(1, seed=6, min_len=30, max_len=30)[0]
    params = SamplingParams(max_new_tokens=8, prompt_logprobs=TOP)
    first = SequenceVerifier(target, prompt, params).verify(FIRST_BLOCKS[block])
    assert_matches(first.prompt_logprobs, target, prompt)
    assert max(kept) <= 8 + len(FIRST_BLOCKS[block].tokens) + 1 and len(kept) > 1
    alone = SequenceVerifier(target, prompt, replace(params, prompt_logprobs=None))
    assert replace(first, prompt_logprobs=None) == alone.verify(FIRST_BLOCKS[block])

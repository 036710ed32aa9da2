"""Greedy speculative decoding must equal the target's own greedy decoding, token for token."""

import pytest

from cascade.protocol.settings import DraftConfig
from cascade.core.loop import generate
from cascade.protocol.settings import FinishReason, SamplingParams
from models import disagreeing_drafter, hf_greedy, random_prompts

NUM_NEW = 24
PROMPTS = random_prompts(8, seed=7)


@pytest.fixture(scope="module", params=["gpt2_pair", "llama_pair"])
def pair_with_reference(request):
    target, drafter = request.getfixturevalue(request.param)
    return target, drafter, [hf_greedy(target, p, NUM_NEW) for p in PROMPTS]


@pytest.mark.parametrize("k", [1, 3, 5, 8])
@pytest.mark.parametrize("drafter_kind", ["small", "disagreeing", "target_itself"])
def test_greedy_speculative_equals_target_greedy(pair_with_reference, k, drafter_kind):
    target, small, references = pair_with_reference
    drafter = {
        "small": small,
        "disagreeing": disagreeing_drafter(target),
        "target_itself": target,
    }[drafter_kind]
    params = SamplingParams(temperature=0.0, max_new_tokens=NUM_NEW)
    total_accepted = total_drafted = 0
    for prompt, expected in zip(PROMPTS, references):
        result = generate(target, prompt, params, drafter, DraftConfig(num_draft_tokens=k))
        assert result.tokens == expected
        assert result.finish_reason is FinishReason.LENGTH
        total_accepted += result.stats.num_accepted_tokens
        total_drafted += result.stats.num_draft_tokens
    if drafter_kind == "disagreeing":
        assert total_accepted == 0
    if drafter_kind == "target_itself":
        assert total_accepted == total_drafted > 0


def test_target_only_equals_target_greedy(pair_with_reference):
    target, _, references = pair_with_reference
    params = SamplingParams(temperature=0.0, max_new_tokens=NUM_NEW)
    for prompt, expected in zip(PROMPTS, references):
        result = generate(target, prompt, params, drafter=None)
        assert result.tokens == expected
        assert result.stats.num_target_passes == NUM_NEW


def test_stop_token_ends_generation(gpt2_pair):
    target, drafter = gpt2_pair
    prompt = PROMPTS[0]
    full = generate(target, prompt, SamplingParams(max_new_tokens=NUM_NEW), drafter).tokens
    stop = full[5]
    params = SamplingParams(max_new_tokens=NUM_NEW, stop_token_ids=(stop,))
    result = generate(target, prompt, params, drafter, DraftConfig(num_draft_tokens=4))
    assert result.tokens == full[: full.index(stop) + 1]
    assert result.finish_reason is FinishReason.STOP

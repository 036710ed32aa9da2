import pytest

from cascade.core.proposers.ngram import ngram_propose


@pytest.mark.parametrize(
    "tokens,k,max_n,min_n,expected",
    [
        ([1, 2, 3, 4, 1, 2, 3], 3, 2, 2, [4, 1, 2]),  # vLLM's worked example
        ([1, 2, 3, 4, 1, 2, 3], 2, 3, 1, [4, 1]),
        ([5, 6, 7, 5, 6, 8, 5, 6], 2, 2, 2, [8, 5]),  # the most recent match wins
        ([1, 2, 3, 4], 3, 3, 1, []),  # nothing repeats
        ([9, 1, 9, 2, 7, 1], 2, 3, 1, [9, 2]),  # falls back to a unigram match
        ([1, 2, 1, 2], 0, 2, 1, []),
        ([4], 2, 2, 1, []),
    ],
)
def test_ngram_cases(tokens, k, max_n, min_n, expected):
    assert ngram_propose(tokens, k, max_n, min_n) == expected


def test_longest_suffix_preferred():
    # suffix [2, 3] occurs at 1; suffix [3] alone occurs later at 4 followed by 9
    tokens = [1, 2, 3, 7, 3, 9, 2, 3]
    assert ngram_propose(tokens, 1, max_n=2, min_n=1) == [7]


def test_ngram_drafting_in_the_loop_is_exact_and_accepts_repeats(gpt2_pair):
    from cascade.core.loop import generate
    from cascade.protocol.settings import DraftConfig, SamplingParams
    from models import random_prompts

    target, drafter = gpt2_pair
    params = SamplingParams(max_new_tokens=40)
    for prompt in random_prompts(4, seed=41):
        expected = generate(target, prompt, params).tokens
        for method, model in (("ngram", None), ("ngram_then_model", drafter)):
            config = DraftConfig(num_draft_tokens=4, method=method, ngram_min_n=1)
            result = generate(target, prompt, params, model, config)
            assert result.tokens == expected
    # A context that repeats itself is copied and accepted.
    looping = (expected * 3)[:60]
    result = generate(target, looping, SamplingParams(max_new_tokens=20), None,
                      DraftConfig(4, method="ngram"))
    assert result.stats.num_draft_tokens > 0

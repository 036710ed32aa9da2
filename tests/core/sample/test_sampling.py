import pytest
import torch
from scipy.stats import kstest

from cascade.protocol.settings import DraftConfig
from cascade.core.loop import generate
from cascade.core.sample.sampling import (
    RowSampling,
    position_uniform,
    position_uniforms,
    process_logits,
    sample_from,
    sparse_to_dense,
    sparsify,
)
from cascade.protocol.settings import SamplingParams
from models import random_prompts


def test_temperature_scales_logits():
    logits = torch.tensor([[0.0, 1.0, 2.0]])
    probs = process_logits(logits, SamplingParams(temperature=0.5))
    torch.testing.assert_close(probs, torch.softmax(logits / 0.5, -1))


def test_top_k_keeps_k_most_likely():
    logits = torch.tensor([[3.0, 1.0, 2.0, 0.0]])
    probs = process_logits(logits, SamplingParams(temperature=1.0, top_k=2))
    expected = torch.softmax(torch.tensor([3.0, 2.0]), -1)
    torch.testing.assert_close(probs[0], torch.tensor([expected[0], 0, expected[1], 0]))


def test_top_p_keeps_smallest_set_reaching_mass():
    probs_in = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    probs = process_logits(probs_in.log(), SamplingParams(temperature=1.0, top_p=0.8))
    torch.testing.assert_close(probs[0], torch.tensor([0.625, 0.375, 0.0, 0.0]))
    probs = process_logits(probs_in.log(), SamplingParams(temperature=1.0, top_p=0.81))
    torch.testing.assert_close(probs[0], torch.tensor([0.5, 0.3, 0.15, 0.0]) / 0.95)


def test_per_row_settings_give_each_row_its_own_processing():
    logits = torch.randn(4, 3, 50, generator=torch.Generator().manual_seed(2)) * 3
    settings = [SamplingParams(temperature=0.7), SamplingParams(temperature=1.3, top_k=5),
                SamplingParams(temperature=1.0, top_p=0.8),
                SamplingParams(temperature=0.5, top_k=12, top_p=0.6)]
    batched = process_logits(logits, RowSampling.of(settings))
    for row, logits_row, params in zip(batched, logits, settings):
        alone = process_logits(logits_row, params)
        assert torch.allclose(row, alone, atol=1e-7), params
        assert int((row[0] > 0).sum()) == int((alone[0] > 0).sum())


def test_sparsify_and_dense_round_trip():
    probs = torch.tensor([[0.1, 0.6, 0.3, 0.0]])
    ids, values = sparsify(probs, 2)
    assert ids.tolist() == [[1, 2]]
    torch.testing.assert_close(values, torch.tensor([[2 / 3, 1 / 3]]))
    dense = sparse_to_dense(ids, values, 4)
    torch.testing.assert_close(dense, torch.tensor([[0, 2 / 3, 1 / 3, 0]], dtype=torch.float64))


def test_sample_from_inverse_cdf_skips_zero_mass():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5]] * 4)
    tokens = sample_from(probs, torch.tensor([0.0, 0.49, 0.5, 0.999999]))
    assert tokens.tolist() == [1, 1, 3, 3]


def test_position_uniforms_are_deterministic_and_uniform():
    assert position_uniform(7, 100, 1) == position_uniform(7, 100, 1)
    assert position_uniform(7, 100, 1) != position_uniform(7, 100, 2)
    assert position_uniform(7, 100, 1) != position_uniform(8, 100, 1)
    values = position_uniforms(seed=3, start=0, count=20_000, stream=0)
    assert values.min() >= 0 and values.max() < 1
    assert kstest(values.numpy(), "uniform").pvalue > 1e-3


@pytest.mark.parametrize("send_proposal", [True, False])
def test_seeded_sampling_is_reproducible(gpt2_pair, send_proposal):
    target, drafter = gpt2_pair
    prompt = random_prompts(1, seed=5)[0]
    config = DraftConfig(num_draft_tokens=3, send_proposal=send_proposal)

    def run(seed):
        params = SamplingParams(temperature=1.0, top_p=0.9, seed=seed, max_new_tokens=30)
        return generate(target, prompt, params, drafter, config).tokens

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_sampled_output_independent_of_round_boundaries_for_target_only(gpt2_pair):
    """Target-only decoding draws each token from (seed, position) alone."""
    target, _ = gpt2_pair
    prompt = random_prompts(1, seed=6)[0]
    params = SamplingParams(temperature=0.8, seed=9, max_new_tokens=20)
    full = generate(target, prompt, params).tokens
    head = generate(target, prompt, SamplingParams(temperature=0.8, seed=9, max_new_tokens=8))
    rest = generate(target, prompt + head.tokens, SamplingParams(temperature=0.8, seed=9,
                                                                 max_new_tokens=12))
    assert head.tokens + rest.tokens == full

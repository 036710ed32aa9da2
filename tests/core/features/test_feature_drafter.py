"""The feature drafter: drafting step by step gives exactly what training unrolls (the
training-time test matches drafting), it loads from its folder beside the target, and the loop
with it stays exact."""

import pytest
import torch

from cascade.core.features.feature_runner import FeatureRunner, is_feature_drafter
from cascade.core.loop import generate
from cascade.protocol.settings import DraftConfig, SamplingParams
from models import feature_pair as make_feature_pair, full_forward
from models import hf_greedy, random_prompts


@pytest.fixture(scope="module")
def feature_pair(tmp_path_factory):
    return make_feature_pair(tmp_path_factory.mktemp("feature"))


def _features(target, tokens):
    out = full_forward(target.model, tokens, output_hidden_states=True)
    return out.hidden_states


def test_drafting_step_by_step_equals_the_unrolled_training_pass(feature_pair):
    target, target_dir, drafter_dir = feature_pair
    runner = FeatureRunner.load(drafter_dir, target_dir)
    drafter = runner.drafter
    tokens = random_prompts(1, seed=3, min_len=12, max_len=12)[0]
    with torch.inference_mode():
        hidden = _features(target, tokens)
        stacked = torch.cat([hidden[i][0] for i in runner.feature_layers], -1)  # [T, L*d]
        states = drafter.unrolled_states(drafter.fuse_features(stacked[None]),
                                         torch.tensor([tokens[1:] + [0]]), 3)
    base = 7  # committed tokens[: base + 1]; target features for positions 0 .. base - 1
    cache = runner.new_cache()
    cache.observe(0, stacked[:base])
    logits = cache.forward_to(tokens[: base + 1]).logits[0]
    for step in range(1, 4):  # step j drafts token base + j from position base - 2 + j
        expected = drafter.head(states[step - 1][0, base - 2 + step])
        torch.testing.assert_close(logits[runner.vocab_map.to_target], expected,
                                   atol=1e-4, rtol=1e-4)
        logits = cache.extend([tokens[base + step]]).logits[0]  # teacher-forced next token


def test_the_folder_says_what_it_is_and_keeps_only_its_own_weights(feature_pair):
    _, target_dir, drafter_dir = feature_pair
    assert is_feature_drafter(drafter_dir) and not is_feature_drafter(target_dir)
    from safetensors import safe_open

    with safe_open(str(drafter_dir / "model.safetensors"), "pt") as f:
        assert not {"embed_weight", "head_weight"} & set(f.keys())
        assert "layer.q_proj.weight" in f.keys()


@pytest.mark.parametrize("k", [1, 4])
def test_greedy_with_the_feature_drafter_equals_target_greedy(feature_pair, k):
    target, target_dir, drafter_dir = feature_pair
    runner = FeatureRunner.load(drafter_dir, target_dir)
    for prompt in random_prompts(2, seed=40 + k):
        result = generate(target, prompt, SamplingParams(max_new_tokens=20), runner,
                          DraftConfig(k))
        assert result.tokens == hf_greedy(target, prompt, 20)
        assert result.stats.num_draft_tokens > 0


def test_features_reach_the_drafter_every_round(feature_pair):
    target, target_dir, drafter_dir = feature_pair
    runner = FeatureRunner.load(drafter_dir, target_dir)
    prompt = random_prompts(1, seed=50)[0]
    params = SamplingParams(temperature=0.8, seed=2, max_new_tokens=16)
    first = generate(target, prompt, params, runner, DraftConfig(3))
    again = generate(target, prompt, params, runner, DraftConfig(3))
    assert first.tokens == again.tokens and first.stats == again.stats  # seeded, reproducible
    from cascade.core.loop import speculative_rounds

    for draft, outcome, sequence in speculative_rounds(target, prompt, params, runner,
                                                       DraftConfig(3)):
        assert sequence.last_features is not None
        assert sequence.last_features.start == len(sequence.committed) - len(outcome.tokens) - 1

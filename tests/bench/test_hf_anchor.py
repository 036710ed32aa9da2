"""Hugging Face assisted generation as the anchor: a restricted-vocabulary drafter works as its
assistant, greedy output equals the target's own greedy output, and the trace counts rounds."""

from types import SimpleNamespace

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from cascade.bench.compare.hf import HfSetting, hf_trace, restricted_to_full_vocab
from cascade.bench.prompts import BenchPrompt
from cascade.core.model.runner import ModelRunner
from cascade.core.model.vocab_map import VocabMap

VOCAB = 96


def _llama(vocab: int, layers: int, seed: int):
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        initializer_range=0.2, tie_word_embeddings=False)).eval()


def test_restricted_drafter_logits_are_spread_over_the_full_vocabulary():
    kept = list(range(0, VOCAB, 2))  # the drafter knows the even ids
    runner = ModelRunner(_llama(len(kept) + 1, 1, 1), vocab_map=VocabMap(kept, VOCAB))
    # target ids 1 (odd: the unknown row 48), 0 and 2 are local rows 48, 0 and 1
    local = runner.model(torch.tensor([[48, 0, 1]])).logits
    model = restricted_to_full_vocab(runner)
    logits = model(input_ids=torch.tensor([[1, 0, 2]])).logits
    assert logits.shape == (1, 3, VOCAB)
    torch.testing.assert_close(logits[0][:, kept], local[0, :, : len(kept)])
    assert torch.isinf(logits[..., 1::2]).all()


def test_assisted_generation_with_restricted_drafter_is_greedy_exact():
    target = _llama(VOCAB, 2, 2)
    target.generation_config.eos_token_id = None
    kept = list(range(VOCAB - 10))
    assistant = restricted_to_full_vocab(
        ModelRunner(_llama(len(kept) + 1, 1, 3), vocab_map=VocabMap(kept, VOCAB)))
    prompt = BenchPrompt("code", "", False, (5, 17, 33, 2, 9))
    job = SimpleNamespace(max_new_tokens=20, temperature=1.0, seed=0)
    with torch.inference_mode():
        alone = hf_trace(target, None, prompt, job, False, None)
        assisted = hf_trace(target, assistant, prompt, job, False, HfSetting(3))
    assert len(alone.tokens) == 20 and alone.passes == 20 and alone.drafted == 0
    assert assisted.tokens == alone.tokens
    assert 0 < assisted.passes <= 20
    assert assisted.drafted <= 3 * assisted.passes and assisted.accepted <= assisted.drafted
    assert len(assisted.chunk_s) == assisted.passes

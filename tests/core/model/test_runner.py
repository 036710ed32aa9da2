import torch

from models import full_forward, random_prompts


def test_extend_matches_full_forward(gpt2_pair):
    target, _ = gpt2_pair
    tokens = random_prompts(1, seed=0, min_len=10, max_len=10)[0]
    cache = target.new_cache()
    first = cache.extend(tokens[:4]).logits
    rest = cache.extend(tokens[4:]).logits
    full = full_forward(target.model, tokens).logits[0]
    torch.testing.assert_close(torch.cat([first, rest]), full, atol=1e-5, rtol=1e-4)


def test_rollback_then_extend_equals_fresh_cache(llama_pair):
    target, _ = llama_pair
    tokens = random_prompts(1, seed=1, min_len=12, max_len=12)[0]
    cache = target.new_cache()
    cache.extend(tokens[:8])
    cache.extend([5, 6, 7])  # a rejected draft tail
    cache.rollback(8)
    assert cache.tokens == tokens[:8]
    assert cache.cache.get_seq_length() == 8
    resumed = cache.extend(tokens[8:]).logits
    fresh = target.new_cache()
    expected = fresh.extend(tokens).logits[8:]
    torch.testing.assert_close(resumed, expected, atol=1e-5, rtol=1e-4)


def test_forward_to_reuses_common_prefix_and_returns_requested_logits(gpt2_pair):
    target, _ = gpt2_pair
    tokens = random_prompts(1, seed=2, min_len=10, max_len=10)[0]
    cache = target.new_cache()
    cache.extend(tokens[:6] + [1, 2])
    logits = cache.forward_to(tokens, num_logits=3).logits
    assert logits.shape == (3, target.vocab_size)
    assert cache.tokens == tokens
    expected = target.new_cache().extend(tokens).logits[-3:]
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-4)
    again = cache.forward_to(tokens, num_logits=1).logits  # cached: refeeds the last token
    torch.testing.assert_close(again[0], expected[-1], atol=1e-5, rtol=1e-4)
    assert cache.tokens == tokens


def test_forward_output_carries_the_requested_layers_for_the_same_positions(llama_pair):
    target, _ = llama_pair
    tokens = random_prompts(1, seed=3, min_len=9, max_len=9)[0]
    plain = target.new_cache().forward_to(tokens, num_logits=3)
    assert plain.hidden_states == ()  # nothing asked, nothing computed
    out = target.new_cache().forward_to(tokens, num_logits=3, hidden_layers=(0, 1, -1))
    torch.testing.assert_close(out.logits, plain.logits)
    full = full_forward(target.model, tokens, output_hidden_states=True).hidden_states
    assert len(out.hidden_states) == 3
    for got, layer in zip(out.hidden_states, (0, 1, -1)):
        assert got.shape == (3, target.model.config.hidden_size)
        torch.testing.assert_close(got, full[layer][0, -3:], atol=1e-5, rtol=1e-4)
    # the last layer's states are what the head reads: they reproduce the logits
    head = target.model.get_output_embeddings()
    with torch.inference_mode():
        logits = head(out.hidden_states[-1].to(target.device)).cpu()
    torch.testing.assert_close(logits, out.logits, atol=1e-4, rtol=1e-4)


def test_restricted_vocabulary_maps_inputs_and_expands_logits(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    from cascade.core.model.runner import ModelRunner
    from cascade.core.model.vocab_map import VocabMap

    kept = [3, 7, 11, 20]  # target ids the drafter knows; local row 4 = anything else
    vocab_map = VocabMap(kept, target_vocab_size=32)
    vocab_map.save(tmp_path)
    loaded = VocabMap.load(tmp_path)
    assert loaded.to_target.tolist() == kept and loaded.target_vocab_size == 32
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=5, n_positions=16, n_embd=16, n_layer=1, n_head=2))
    runner = ModelRunner(model, vocab_map=loaded)
    assert runner.vocab_size == 32
    logits = runner.new_cache().extend([7, 25, 20]).logits
    local = full_forward(model, [1, 4, 3]).logits[0]
    assert logits.shape == (3, 32)
    torch.testing.assert_close(logits[:, kept], local[:, :4])
    others = [i for i in range(32) if i not in kept]
    assert torch.isinf(logits[:, others]).all()

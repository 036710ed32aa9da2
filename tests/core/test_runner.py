import torch

from models import random_prompts


def test_extend_matches_full_forward(gpt2_pair):
    target, _ = gpt2_pair
    tokens = random_prompts(1, seed=0, min_len=10, max_len=10)[0]
    session = target.new_session()
    first = session.extend(tokens[:4])
    rest = session.extend(tokens[4:])
    full = target.model(torch.tensor([tokens])).logits[0]
    torch.testing.assert_close(torch.cat([first, rest]), full, atol=1e-5, rtol=1e-4)


def test_rollback_then_extend_equals_fresh_cache(llama_pair):
    target, _ = llama_pair
    tokens = random_prompts(1, seed=1, min_len=12, max_len=12)[0]
    session = target.new_session()
    session.extend(tokens[:8])
    session.extend([5, 6, 7])  # a rejected draft tail
    session.rollback(8)
    assert session.tokens == tokens[:8]
    assert session.cache.get_seq_length() == 8
    resumed = session.extend(tokens[8:])
    fresh = target.new_session()
    expected = fresh.extend(tokens)[8:]
    torch.testing.assert_close(resumed, expected, atol=1e-5, rtol=1e-4)


def test_forward_to_reuses_common_prefix_and_returns_requested_logits(gpt2_pair):
    target, _ = gpt2_pair
    tokens = random_prompts(1, seed=2, min_len=10, max_len=10)[0]
    session = target.new_session()
    session.extend(tokens[:6] + [1, 2])
    logits = session.forward_to(tokens, num_logits=3)
    assert logits.shape == (3, target.vocab_size)
    assert session.tokens == tokens
    expected = target.new_session().extend(tokens)[-3:]
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-4)
    again = session.forward_to(tokens, num_logits=1)  # already cached: refeeds the last token
    torch.testing.assert_close(again[0], expected[-1], atol=1e-5, rtol=1e-4)
    assert session.tokens == tokens


def test_restricted_vocabulary_maps_inputs_and_expands_logits(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    from cascade.runner import ModelRunner, VocabMap

    kept = [3, 7, 11, 20]  # target ids the drafter knows; local row 4 = anything else
    vocab_map = VocabMap(kept, target_vocab_size=32)
    vocab_map.save(tmp_path)
    loaded = VocabMap.load(tmp_path)
    assert loaded.to_target.tolist() == kept and loaded.target_vocab_size == 32
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=5, n_positions=16, n_embd=16, n_layer=1, n_head=2))
    runner = ModelRunner(model, vocab_map=loaded)
    assert runner.vocab_size == 32
    logits = runner.new_session().extend([7, 25, 20])
    local = model(torch.tensor([[1, 4, 3]])).logits[0]
    assert logits.shape == (3, 32)
    torch.testing.assert_close(logits[:, kept], local[:, :4])
    others = [i for i in range(32) if i not in kept]
    assert torch.isinf(logits[:, others]).all()

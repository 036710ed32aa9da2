"""Three ranks (more than two: the partials are gathered and added in rank order): split passes
match the whole target, and the invariant pass stays batch-invariant."""

import copy

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from cascade.core.parallel import rank_processes
from cascade.core.verify.engine import Pass, VerifyEngine
from cascade.core.model.runner import ModelSpec
from models import on_device
from tokenizers_fixture import build_tokenizer

PROMPTS = [[1, 5, 7, 9, 11, 13, 2, 4], [3, 3, 3, 8, 9], [40, 41, 42, 43, 44, 45, 46, 47]]


def test_three_ranks_match_the_whole_model_and_stay_batch_invariant(tmp_path):
    torch.manual_seed(5)
    config = LlamaConfig(vocab_size=96, hidden_size=48, intermediate_size=96,
                         num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=3,
                         head_dim=8, max_position_embeddings=256, initializer_range=0.2,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    copy.deepcopy(model).save_pretrained(tmp_path)
    build_tokenizer(tmp_path)
    whole = on_device(model)
    split = rank_processes.load_sharded(ModelSpec(str(tmp_path)), world=3, threads=1)
    try:
        assert split.model.cascade_shard.world == 3
        for invariant in (False, True):
            outputs = []
            for runner in (whole, split):
                engine = VerifyEngine(runner, invariant=invariant)
                caches = [engine.admit(64) for _ in PROMPTS]
                outputs.append(engine.run([Pass(c, p, 3) for c, p in zip(caches, PROMPTS)]))
            for a, b in zip(*outputs):
                torch.testing.assert_close(b.logits, a.logits, atol=1e-4, rtol=1e-4)
        engine = VerifyEngine(split, invariant=True)
        alone = engine.run([Pass(engine.admit(64), PROMPTS[2], 4)])[0].logits
        caches = [engine.admit(64) for _ in PROMPTS]
        crowded = engine.run([Pass(c, p, 4) for c, p in zip(caches, PROMPTS)])[2].logits
        assert torch.equal(alone, crowded)
    finally:
        rank_processes.stop_ranks(split)

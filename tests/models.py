"""Tiny random-initialised causal LMs built inside the tests (no download, float32, CPU)."""

from __future__ import annotations

import copy

import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from cascade.core.runner import ModelRunner

VOCAB_SIZE = 96
MAX_POSITIONS = 256


def tiny_gpt2(seed: int, num_layers: int = 2, width: int = 64) -> ModelRunner:
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=VOCAB_SIZE, n_positions=MAX_POSITIONS, n_embd=width, n_layer=num_layers,
        n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, initializer_range=0.2,
        tie_word_embeddings=False,
    )
    return ModelRunner(GPT2LMHeadModel(config))


def tiny_llama(seed: int, num_layers: int = 2, width: int = 64) -> ModelRunner:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE, hidden_size=width, intermediate_size=2 * width,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=MAX_POSITIONS, initializer_range=0.2, tie_word_embeddings=False,
    )
    return ModelRunner(LlamaForCausalLM(config))


def disagreeing_drafter(target: ModelRunner) -> ModelRunner:
    """A copy of the target whose argmax is always the target's argmax + 1 (mod vocab)."""
    model = copy.deepcopy(target.model)
    head = model.get_output_embeddings()
    head.weight.data = torch.roll(head.weight.data, shifts=1, dims=0)
    return ModelRunner(model)


def random_prompts(count: int, seed: int, min_len: int = 3, max_len: int = 12) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (count,), generator=generator).tolist()
    return [torch.randint(0, VOCAB_SIZE, (n,), generator=generator).tolist() for n in lengths]


def hf_greedy(runner: ModelRunner, prompt: list[int], num_new: int = 24) -> list[int]:
    """The target's own greedy decoding (Hugging Face generate), the exactness reference."""
    output = runner.model.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        do_sample=False,
        max_new_tokens=num_new,
        min_new_tokens=num_new,
        pad_token_id=0,
        eos_token_id=None,
    )
    return output[0, len(prompt) :].tolist()


def feature_pair(root):
    """A tiny Llama target saved to ``root/target`` and a random (not near-uniform) feature
    drafter for it in ``root/drafter``; returns (target runner, target dir, drafter dir)."""
    from cascade.core.feature_runner import write_feature_drafter
    from cascade.distill.feature_run import build_drafter

    target = tiny_llama(seed=21, num_layers=4)
    target.model.save_pretrained(root / "target")
    drafter, vocab_map = build_drafter(target.model, list(range(0, VOCAB_SIZE, 2)), seed=5)
    with torch.no_grad():
        for p in drafter.parameters():
            p.normal_(0, 0.3) if p.dim() > 1 else p.fill_(1.0)
    write_feature_drafter(drafter, vocab_map, root / "drafter", "tiny")
    return target, root / "target", root / "drafter"


def tiny_gpt2_folder(folder, num_layers: int = 1):
    """A random 32-wide GPT-2 with the tests' real tokenizer, saved to ``folder``."""
    from tokenizers_fixture import build_tokenizer

    tokenizer = build_tokenizer(folder)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=256, n_embd=32,
                        n_layer=num_layers, n_head=2, eos_token_id=tokenizer.eos_token_id)
    GPT2LMHeadModel(config).save_pretrained(folder)
    return folder

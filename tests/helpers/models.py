"""Tiny random-initialised causal LMs built inside the tests (no download, float32).

They run on ``DEVICE``: the CPU unless ``CASCADE_TEST_DEVICE`` names another torch device
(``cuda`` runs the core exactness tests on a GPU: ``scripts/gpu_tests.sh``).
"""

from __future__ import annotations

import copy
import os
from types import SimpleNamespace

import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from cascade.core.model.runner import ModelRunner

VOCAB_SIZE = 96
MAX_POSITIONS = 256
DEVICE = os.environ.get("CASCADE_TEST_DEVICE", "cpu")


def on_device(model) -> ModelRunner:
    """``model`` in float32 on the tests' device, wrapped in a runner."""
    return ModelRunner(model.float().to(DEVICE))


def tiny_gpt2(seed: int, num_layers: int = 2, width: int = 64) -> ModelRunner:
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=VOCAB_SIZE, n_positions=MAX_POSITIONS, n_embd=width, n_layer=num_layers,
        n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, initializer_range=0.2,
        tie_word_embeddings=False,
    )
    return on_device(GPT2LMHeadModel(config))


def tiny_llama(seed: int, num_layers: int = 2, width: int = 64) -> ModelRunner:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE, hidden_size=width, intermediate_size=2 * width,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=MAX_POSITIONS, initializer_range=0.2, tie_word_embeddings=False,
    )
    return on_device(LlamaForCausalLM(config))


def disagreeing_drafter(target: ModelRunner) -> ModelRunner:
    """A copy of the target whose argmax is always the target's argmax + 1 (mod vocab)."""
    model = copy.deepcopy(target.model)
    head = model.get_output_embeddings()
    head.weight.data = torch.roll(head.weight.data, shifts=1, dims=0)
    return ModelRunner(model)


def full_forward(model, tokens: list[int], **kwargs) -> SimpleNamespace:
    """transformers' own forward over one row of ``tokens`` on the model's device, its logits
    (and hidden states, when asked for) brought to the CPU: the tests' reference."""
    with torch.no_grad():
        out = model(torch.tensor([tokens], device=model.device), **kwargs)
    hidden = out.hidden_states
    return SimpleNamespace(logits=out.logits.cpu(),
                           hidden_states=None if hidden is None else tuple(h.cpu() for h in hidden))


def random_prompts(count: int, seed: int, min_len: int = 3, max_len: int = 12) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (count,), generator=generator).tolist()
    return [torch.randint(0, VOCAB_SIZE, (n,), generator=generator).tolist() for n in lengths]


def penalized(logits: torch.Tensor, prompt: list[int], generated: list[int], presence: float,
              frequency: float, repetition: float) -> torch.Tensor:
    """The slow reference of the penalties on one position's ``logits`` ([vocab]): repetition
    over the prompt and ``generated``, then presence and frequency over ``generated``."""
    counts = torch.bincount(torch.tensor(generated, dtype=torch.long),
                            minlength=logits.shape[-1]).to(logits.dtype)
    seen = counts > 0
    seen[torch.tensor(prompt)] = True
    logits = torch.where(seen, torch.where(logits > 0, logits / repetition,
                                           logits * repetition), logits)
    return logits - presence * (counts > 0) - frequency * counts


def hf_greedy(runner: ModelRunner, prompt: list[int], num_new: int = 24,
              **processors) -> list[int]:
    """The target's own greedy decoding (Hugging Face generate), the exactness reference;
    ``processors``: generate's own (e.g. ``sequence_bias``, or ``min_new_tokens`` with an
    ``eos_token_id``) in place of the defaults below."""
    output = runner.model.generate(
        torch.tensor([prompt], device=runner.device),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=runner.device),
        do_sample=False,
        max_new_tokens=num_new,
        **{"min_new_tokens": num_new, "pad_token_id": 0, "eos_token_id": None, **processors},
    )
    return output[0, len(prompt) :].tolist()


def feature_pair(root):
    """A tiny Llama target saved to ``root/target`` and a random (not near-uniform) feature
    drafter for it in ``root/drafter``; returns (target runner, target dir, drafter dir)."""
    from cascade.core.features.feature_runner import write_feature_drafter
    from cascade.distill.features.train import build_drafter

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


def _decoder_sizes(num_layers: int, width: int) -> dict:
    """The sizes every tiny decoder below shares (4 query heads, 2 key-value heads)."""
    return dict(vocab_size=VOCAB_SIZE, hidden_size=width, intermediate_size=2 * width,
                num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                head_dim=width // 4, max_position_embeddings=MAX_POSITIONS,
                initializer_range=0.2, tie_word_embeddings=False)


def _runner(model_class, config) -> ModelRunner:
    return on_device(model_class(config))


def tiny_mistral(seed: int, window: int = 4, num_layers: int = 2, width: int = 64):
    """Mistral: every layer attends within a sliding window of ``window`` positions."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(seed)
    return _runner(MistralForCausalLM,
                   MistralConfig(sliding_window=window, **_decoder_sizes(num_layers, width)))


def tiny_qwen2_sliding(seed: int, window: int = 4, num_layers: int = 2, width: int = 64):
    """Qwen2 with ``use_sliding_window``: layers from ``max_window_layers`` on are windowed."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(use_sliding_window=True, sliding_window=window, max_window_layers=1,
                         **_decoder_sizes(num_layers, width))
    assert config.layer_types == ["full_attention"] + ["sliding_attention"] * (num_layers - 1)
    return _runner(Qwen2ForCausalLM, config)


def tiny_gemma2(seed: int, window: int = 4, softcap: float = 2.0, num_layers: int = 2,
                width: int = 64):
    """Gemma-2: sliding and full layers alternating, attention logits soft-capped at
    ``softcap`` (small, so that the capping changes the result)."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(seed)
    config = Gemma2Config(sliding_window=window, attn_logit_softcapping=softcap,
                          query_pre_attn_scalar=width // 4, **_decoder_sizes(num_layers, width))
    return _runner(Gemma2ForCausalLM, config)


def tiny_gemma3(seed: int, window: int = 4, num_layers: int = 2, width: int = 64):
    """Gemma-3 text: a sliding layer, then a full one (each with its own rotary base)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    layer_types = ["sliding_attention", "full_attention"] * (num_layers // 2)
    config = Gemma3TextConfig(sliding_window=window, layer_types=layer_types,
                              query_pre_attn_scalar=width // 4,
                              **_decoder_sizes(num_layers, width))
    return _runner(Gemma3ForCausalLM, config)


def tiny_phi3_longrope(seed: int, original_max: int = 32, num_layers: int = 2,
                       width: int = 64):
    """Phi-3 with LongRoPE: sequences longer than ``original_max`` positions switch to the
    long factors (far apart from the short ones, so the switch shows in the logits)."""
    from transformers import Phi3Config, Phi3ForCausalLM

    torch.manual_seed(seed)
    half = width // 4 // 2
    rope = {"rope_type": "longrope", "rope_theta": 10000.0,
            "short_factor": [1.0 + 0.1 * i for i in range(half)],
            "long_factor": [2.0 + 1.5 * i for i in range(half)],
            "factor": MAX_POSITIONS / original_max,
            "original_max_position_embeddings": original_max}
    config = Phi3Config(rope_parameters=rope, original_max_position_embeddings=original_max,
                        pad_token_id=0, bos_token_id=None, eos_token_id=None,
                        **_decoder_sizes(num_layers, width))
    return _runner(Phi3ForCausalLM, config)


def tiny_llama_dynamic(seed: int, max_positions: int = 32, num_layers: int = 2,
                       width: int = 64):
    """Llama with dynamic NTK rope: past ``max_positions`` the frequencies depend on the
    sequence length."""
    torch.manual_seed(seed)
    sizes = _decoder_sizes(num_layers, width) | {"max_position_embeddings": max_positions}
    config = LlamaConfig(rope_parameters={"rope_type": "dynamic", "factor": 2.0,
                                          "rope_theta": 10000.0}, **sizes)
    return _runner(LlamaForCausalLM, config)

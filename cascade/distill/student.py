"""The drafter being trained: a narrow Llama over a restricted vocabulary (FR-Spec).

Its vocabulary is the target's most frequent tokens (plus one row for everything else), so the
output head costs a fraction of the target's 49k-row head; its embeddings start from a PCA of
the target's embeddings for those tokens.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from cascade.core.model.vocab_map import VocabMap


@dataclass(frozen=True)
class StudentShape:
    vocab_size: int = 16384
    """Target tokens the drafter can propose (the most frequent ones)."""
    hidden_size: int = 256
    num_layers: int = 6
    intermediate_size: int = 768
    num_heads: int = 4
    num_kv_heads: int = 2


def choose_vocabulary(counts: Counter, special_ids: list[int], size: int) -> list[int]:
    """The ``size`` most frequent token ids, special tokens always included, sorted."""
    chosen = set(special_ids)
    for token, _ in counts.most_common():
        if len(chosen) >= size:
            break
        chosen.add(token)
    return sorted(chosen)


def pca_embeddings(target_embeddings: torch.Tensor, rows: list[int], width: int) -> torch.Tensor:
    """[len(rows)+1, width]: the rows projected on the target's top principal directions; the
    last (unknown-token) row is the projected mean, i.e. zero."""
    weights = target_embeddings.float()
    mean = weights.mean(0, keepdim=True)
    _, _, components = torch.pca_lowrank(weights - mean, q=width, center=False, niter=4)
    projected = (weights[rows] - mean) @ components  # [rows, width]
    projected = projected / projected.std() * 0.02 * 8  # a healthy scale for a fresh network
    return torch.cat([projected, torch.zeros(1, width)])


def build_student(shape: StudentShape, vocab: list[int], target, seed: int):
    """Returns (LlamaForCausalLM, VocabMap) for the chosen vocabulary."""
    torch.manual_seed(seed)
    target_config = target.config
    config = LlamaConfig(
        vocab_size=len(vocab) + 1, hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size, num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads, num_key_value_heads=shape.num_kv_heads,
        max_position_embeddings=target_config.max_position_embeddings,
        rope_theta=getattr(target_config, "rope_theta", 10000.0), tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(config)
    embeddings = pca_embeddings(target.get_input_embeddings().weight.detach(), vocab,
                                shape.hidden_size)
    model.get_input_embeddings().weight.data.copy_(embeddings)
    return model, VocabMap(vocab, target.get_input_embeddings().weight.shape[0])

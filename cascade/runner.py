"""The KV-cached model runner: one Hugging Face causal LM, one cache per session.

A session's cache is addressed by position: it holds the KV entries of ``tokens`` and nothing
else. ``extend`` feeds new tokens and returns their logits; ``rollback`` truncates to a committed
length (the rejected tail of a draft is simply forgotten); ``forward_to`` makes the cache hold
exactly a given token sequence in one forward pass, reusing the longest common prefix.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, PreTrainedModel

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class ModelSpec:
    """Where a model comes from and how it runs."""

    name_or_path: str
    """A local folder saved with save_pretrained, or a hub name."""
    dtype: str = "float32"
    """One of float32 (exact greedy reference), bfloat16 or float16."""
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")


class ModelRunner:
    """A causal LM in eval mode plus its tokenizer (if any); hands out per-session caches."""

    def __init__(self, model: PreTrainedModel, tokenizer=None) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device

    @classmethod
    def load(cls, spec: ModelSpec) -> "ModelRunner":
        model = AutoModelForCausalLM.from_pretrained(
            spec.name_or_path, dtype=DTYPES[spec.dtype]
        ).to(spec.device)
        tokenizer = AutoTokenizer.from_pretrained(spec.name_or_path)
        return cls(model, tokenizer)

    @property
    def vocab_size(self) -> int:
        """Width of the logits (may exceed the tokenizer's length)."""
        return self.model.get_output_embeddings().weight.shape[0]

    @property
    def max_length(self) -> int:
        config = self.model.config
        return getattr(config, "max_position_embeddings", None) or config.n_positions

    def new_session(self) -> "KVSession":
        return KVSession(self)


class KVSession:
    """The KV cache of one sequence; ``tokens`` are exactly the positions it holds."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.cache = DynamicCache(config=runner.model.config)
        self.tokens: list[int] = []

    @torch.inference_mode()
    def extend(self, token_ids: list[int], num_logits: int = 0) -> torch.Tensor:
        """Feed tokens; returns float32 logits [n, vocab] for the last ``num_logits`` (0 = all)."""
        assert token_ids, "extend needs at least one token"
        start, count = len(self.tokens), len(token_ids)
        device = self.runner.device
        positions = torch.arange(start, start + count, device=device)
        output = self.runner.model(
            input_ids=torch.tensor([token_ids], device=device),
            position_ids=positions.unsqueeze(0),
            cache_position=positions,
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=num_logits,
        )
        self.tokens.extend(token_ids)
        return output.logits[0].float().cpu()

    def rollback(self, length: int) -> None:
        """Forget every position at or after ``length``."""
        excess = len(self.tokens) - length
        if excess > 0:
            self.cache.crop(-excess)  # transformers 5.x: a negative count removes tokens
            del self.tokens[length:]

    def forward_to(self, token_ids: list[int], num_logits: int = 1) -> torch.Tensor:
        """Make the cache hold exactly ``token_ids`` in one forward pass and return the logits
        [num_logits, vocab] of its last ``num_logits`` positions.

        The longest prefix already cached is reused; at least the last ``num_logits`` tokens are
        (re)fed so their logits exist.
        """
        assert 1 <= num_logits <= len(token_ids), "need logits for 1..len(token_ids) positions"
        reuse = min(_common_prefix_len(self.tokens, token_ids), len(token_ids) - num_logits)
        self.rollback(reuse)
        return self.extend(token_ids[reuse:], num_logits=num_logits)


def _common_prefix_len(a: list[int], b: list[int]) -> int:
    limit = min(len(a), len(b))
    for i in range(limit):
        if a[i] != b[i]:
            return i
    return limit

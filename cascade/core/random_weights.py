"""Models with random weights built from a config directly on a device (benchmarks of shapes
whose weights are not here).

The target is a folder holding a ``config.json`` (no weights) or a built-in name
(``BUILTIN_CONFIGS``: ``llama3-8b``). The model is constructed under ``torch.device(device)``
with the wanted dtype as torch's default, so its parameters are allocated and initialised there
and then, never on the CPU first and never saved. Seeded: every process that builds one gets
the same weights (the ranks of a tensor-parallel benchmark each keep their slice).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, PretrainedConfig

LLAMA3_8B = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                 num_key_value_heads=8, intermediate_size=14336, vocab_size=128256,
                 rope_theta=500000.0, max_position_embeddings=8192, tie_word_embeddings=False,
                 bos_token_id=128000, eos_token_id=128001)
"""Llama-3-8B's shapes (about 8.0e9 parameters: 16 GB in bfloat16)."""
BUILTIN_CONFIGS: dict[str, Callable[[], PretrainedConfig]] = {
    "llama3-8b": lambda: LlamaConfig(**LLAMA3_8B)}
"""Targets ``--random-weights`` knows by name."""

def random_config(target: Path | str) -> PretrainedConfig:
    """The config of a built-in name, else of the folder's ``config.json``."""
    builtin = BUILTIN_CONFIGS.get(str(target))
    if builtin is not None:
        return builtin()
    if not (Path(target) / "config.json").is_file():
        raise ValueError(f"--random-weights needs a folder with a config.json or one of "
                         f"{sorted(BUILTIN_CONFIGS)}, got {str(target)!r}")
    return AutoConfig.from_pretrained(target)


def random_model(target: Path | str, dtype: torch.dtype, device: str | torch.device):
    """The causal LM of ``random_config(target)`` with random weights, built on ``device``
    in ``dtype`` (seeded), in eval mode."""
    config = random_config(target)
    before = torch.get_default_dtype()
    torch.manual_seed(0)
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    finally:
        torch.set_default_dtype(before)
    return model.eval()

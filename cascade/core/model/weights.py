"""Where a model comes from and how it runs (``ModelSpec``): its weights from a folder (or hub
name), or random from a config, and, for a tensor-parallel rank, only its slice
(``cascade.core.model.tensor_parallel``).

Random weights (benchmarks of shapes whose weights are not here): the target is a folder holding a ``config.json`` (no weights) or a built-in name
(``BUILTIN_CONFIGS``: ``llama3-8b``). The model is constructed under ``torch.device(device)``
with the wanted dtype as torch's default, so its parameters are allocated and initialised there
and then, never on the CPU first and never saved. Seeded: every process that builds one gets
the same weights (the ranks of a tensor-parallel benchmark each keep their slice).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, PretrainedConfig

from cascade.core.model.dtypes import auto_dtype
from cascade.core.model.tensor_parallel import Shard, check, shard

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class ModelSpec:
    """Where a model comes from and how it runs."""

    name_or_path: str
    """A local folder saved with save_pretrained, or a hub name."""
    dtype: str = "float32"
    """One of float32, bfloat16 or float16, or auto (``cascade.core.model.dtypes``: bfloat16 where
    the hardware runs it fast, float32 elsewhere), resolved when the spec is made."""
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.dtype == "auto":
            object.__setattr__(self, "dtype", auto_dtype(self.device))
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES) + ['auto']}, "
                             f"got {self.dtype!r}")


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


def load_causal_lm(name_or_path: str, dtype: torch.dtype, device: str,
                   slice_of: Shard | None = None, random_weights: bool = False):
    """The model on ``device``; with ``slice_of``, only that rank's slice (the checkpoint is
    read memory-mapped, then split). ``random_weights``: built from its config, seeded."""
    if random_weights:
        model = random_model(name_or_path, dtype, device)
    else:
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype)
    if slice_of is not None:
        shard(model, slice_of.rank, slice_of.world, slice_of.group)
    return model.to(device)


def check_split(name_or_path: str, world: int, builtin: bool = False) -> None:
    """``tensor_parallel.check`` on a model folder (or hub name; with ``builtin`` also a
    built-in config's name) without reading its weights: the model is built on the meta
    device from its config."""
    config = random_config(name_or_path) if builtin else AutoConfig.from_pretrained(name_or_path)
    with torch.device("meta"):
        check(AutoModelForCausalLM.from_config(config), world)

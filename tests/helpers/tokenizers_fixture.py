"""A tiny real Hugging Face tokenizer (byte-level BPE, ~300 tokens) built in milliseconds.

Byte-level BPE with few merges splits accented and CJK characters across several tokens, which
is what incremental detokenization has to get right.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

EOS_TOKEN = "<|endoftext|>"
VOCAB_SIZE = 300
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
TRAINING_TEXT = [
    "Hello world, this is a small test of the speculative decoding gateway.",
    "The quick brown fox jumps over the lazy dog.",
    "A drafter proposes tokens and the verifier accepts or rejects them.",
    "Café crème, déjà vu, naïve résumé.",
    "日本語のテキストも少しあります。",
    "Once upon a time there was a tiny model that told short stories.",
]


def build_tokenizer(path: str | Path | None = None) -> PreTrainedTokenizerFast:
    """The tokenizer (eos <|endoftext|>, a simple chat template); saved to path when given."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(TRAINING_TEXT * 4, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token=EOS_TOKEN, chat_template=CHAT_TEMPLATE
    )
    if path is not None:
        tokenizer.save_pretrained(str(path))
    return tokenizer

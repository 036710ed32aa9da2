"""A prompt as one user turn through the model's chat template: how the gateway's gRPC API (with
``chat``), the benchmark and distillation all send a plain-text prompt to an instruct model."""

from __future__ import annotations


def user_turn(text: str) -> list[dict[str, str]]:
    """The messages: one user turn; the template adds its own system prompt, if any."""
    return [{"role": "user", "content": text}]


def chat_prompt_ids(tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` as a user turn, ready for the assistant's answer."""
    return tokenizer.apply_chat_template(user_turn(text), add_generation_prompt=True,
                                         tokenize=True, return_dict=False)

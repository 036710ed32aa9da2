"""The chat encoding, in one place: messages through the model's chat template, ready for the
assistant's answer. The HTTP chat API, the gRPC ``chat`` flag, the benchmark and distillation all
encode prompts here. Control tokens inside message contents stay plain text, so a user cannot
forge turns or an end of sequence."""

from __future__ import annotations

from collections.abc import Sequence


def user_turn(text: str) -> list[dict[str, str]]:
    """The messages for a plain-text prompt: one user turn (the template adds its own system
    prompt, if any)."""
    return [{"role": "user", "content": text}]


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def chat_ids(tokenizer, messages: Sequence[dict], tools: list[dict] | None = None,
             add_generation_prompt: bool = True) -> list[int]:
    """Token ids of ``messages`` through the chat template, with the assistant turn opened
    (unless ``add_generation_prompt`` is False; ``tools``: function definitions for a template
    that renders them)."""
    return list(tokenizer.apply_chat_template(
        list(messages), tools=tools, add_generation_prompt=add_generation_prompt,
        tokenize=True, return_dict=False, sanitize_control_tokens=True))


def chat_prompt_ids(tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` sent as one user turn."""
    return chat_ids(tokenizer, user_turn(text))


def chat_prompts_ids(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """``chat_prompt_ids`` of many texts in one batched call (distillation encodes thousands)."""
    conversations = [user_turn(text) for text in texts]
    return [list(ids) for ids in tokenizer.apply_chat_template(
        conversations, add_generation_prompt=True, tokenize=True, return_dict=False,
        sanitize_control_tokens=True)]

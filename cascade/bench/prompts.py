"""Benchmark prompt sets in three domains, written for the benchmark (none is a training prompt).

prose: plain text to continue (no chat template); chat: questions a user would ask an assistant;
code: programming requests. Chat and code go through the model's chat template when it has one.
"""

from __future__ import annotations

from dataclasses import dataclass

from cascade.protocol.request.chat import chat_prompt_ids


@dataclass(frozen=True)
class Domain:
    name: str
    chat: bool
    """Send each prompt as one user message through the chat template."""
    prompts: tuple[str, ...]


DOMAINS = (
    Domain("prose", chat=False, prompts=(
        "The lighthouse keeper climbed the spiral stairs every evening at dusk. On the night of "
        "the storm, he noticed that",
        "Bread has been baked for thousands of years. The simplest loaf needs only flour, water "
        "and salt, yet",
        "When the first railways crossed the continent, small towns along the line",
        "Glaciers move slowly, but over centuries they carve entire valleys. Scientists measure "
        "their speed by",
    )),
    Domain("chat", chat=True, prompts=(
        "What are some good ways to fall asleep faster?",
        "Can you explain what inflation is to a teenager?",
        "I have a job interview tomorrow. How should I prepare?",
        "Why do cats purr?",
    )),
    Domain("code", chat=True, prompts=(
        "Write a Python function that checks whether a string is a palindrome.",
        "Write a Python function that merges two sorted lists into one sorted list.",
        "Explain what a Python list comprehension is, with an example.",
        "Write a Python class for a simple bank account with deposit and withdraw methods.",
    )),
)


def domain_names() -> list[str]:
    return [domain.name for domain in DOMAINS]


def encode(tokenizer, text: str, chat: bool) -> list[int]:
    """Token ids exactly as the gateway makes them (chat template when asked and present)."""
    if chat and tokenizer.chat_template:
        return chat_prompt_ids(tokenizer, text)
    return tokenizer(text).input_ids


@dataclass(frozen=True)
class BenchPrompt:
    domain: str
    text: str
    chat: bool
    """Whether the chat template applies (the domain asks for it and the tokenizer has one)."""
    token_ids: tuple[int, ...]


def bench_prompts(tokenizer, per_domain: int, domains: list[str] | None = None
                  ) -> list[BenchPrompt]:
    chosen = [d for d in DOMAINS if domains is None or d.name in domains]
    unknown = set(domains or ()) - {d.name for d in DOMAINS}
    if unknown:
        raise ValueError(f"unknown domains {sorted(unknown)}; choose from {domain_names()}")
    prompts = []
    for domain in chosen:
        if not 1 <= per_domain <= len(domain.prompts):
            raise ValueError(f"prompts per domain must be in [1, {len(domain.prompts)}]")
        chat = domain.chat and bool(tokenizer.chat_template)
        for text in domain.prompts[:per_domain]:
            prompts.append(BenchPrompt(domain.name, text, chat,
                                       tuple(encode(tokenizer, text, chat))))
    return prompts

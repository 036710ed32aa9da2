"""The slow reference for structured outputs: the target's greedy decoding with the grammar's
mask applied at each step, the matcher rebuilt from scratch and fed every generated token each
time (no rollback, no drafted tokens, no caches)."""

from __future__ import annotations

import llguidance
import llguidance.torch as llg_torch
import torch

from cascade.core.sample.grammar import ll_tokenizer
from cascade.core.model.runner import ModelRunner
from cascade.protocol.grammar import Grammar, to_llguidance

SCHEMAS = {
    "flat": {"type": "object", "properties": {
        "ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 0, "maximum": 999},
        "kind": {"enum": ["red", "green", "blue"]}},
        "required": ["ok", "n", "kind"], "additionalProperties": False},
    "nested": {"type": "object", "properties": {
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 2},
        "owner": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0,
                                                          "maximum": 99}},
                  "required": ["id"], "additionalProperties": False}},
        "required": ["tags", "owner"], "additionalProperties": False},
}
"""Schemas whose every valid value is short, so a random-weight model completes them."""


def fresh_mask(runner: ModelRunner, grammar: Grammar, before: list[int]) -> torch.Tensor:
    """[vocab] bool: the tokens ``grammar`` allows after ``before``, from a new matcher."""
    matcher = llguidance.LLMatcher(ll_tokenizer(runner.tokenizer, runner.vocab_size),
                                   to_llguidance(grammar), log_level=0)
    assert matcher.consume_tokens(before), matcher.get_error()
    bits = llg_torch.allocate_token_bitmask(1, runner.vocab_size)
    llg_torch.fill_next_token_bitmask(matcher, bits, 0)
    logits = torch.zeros(1, runner.vocab_size)
    llg_torch.apply_token_bitmask_inplace(logits, bits)
    return torch.isfinite(logits[0])


def masked_greedy(runner: ModelRunner, prompt: list[int], grammar: Grammar,
                  max_new_tokens: int) -> list[int]:
    """Greedy decoding of the target under ``grammar``'s mask, one full forward pass a token,
    ending after end-of-sequence or ``max_new_tokens``."""
    generated: list[int] = []
    eos = runner.tokenizer.eos_token_id
    while len(generated) < max_new_tokens and (not generated or generated[-1] != eos):
        with torch.no_grad():
            logits = runner.model(torch.tensor([prompt + generated])).logits[0, -1].float()
        allowed = fresh_mask(runner, grammar, generated)
        generated.append(int(torch.where(allowed, logits, float("-inf")).argmax()))
    return generated


def masked_grammar_rows(matcher, vocab_size: int, histories: list[list[int]]) -> torch.Tensor:
    """[rows, vocab] bool: what ``matcher.apply`` leaves finite in rows of zeros."""
    logits = torch.zeros(len(histories), vocab_size)
    matcher.apply(logits, histories)
    return torch.isfinite(logits)

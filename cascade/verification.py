"""Verification: the target model scores a draft block in one pass and keeps what the rule allows.

A ``VerifySession`` owns the committed tokens of one generation (prompt included) and the target's
KV cache for them. ``verify`` feeds the last committed token plus the k drafted tokens, gets the
k+1 target distributions, applies the acceptance rule with the session's per-position random
numbers, and commits the accepted tokens plus one recovered or bonus token. A block with no tokens
is plain target decoding (k = 0).
"""

from __future__ import annotations

import torch

from cascade.acceptance import AcceptResult, greedy_accept, point_mass_accept, speculative_accept
from cascade.runner import ModelRunner
from cascade.sampling import (
    STREAM_ACCEPT,
    STREAM_SAMPLE,
    position_uniforms,
    process_logits,
    sparse_to_dense,
)
from cascade.types import (
    AcceptanceRule,
    DraftBlock,
    FinishReason,
    SamplingParams,
    SpecStats,
    Verdict,
    resolve_rule,
)


class InvalidDraft(ValueError):
    """A draft block that cannot be verified as sent (a caller mistake, not a server fault)."""


class VerifySession:
    """The target side of one generation."""

    def __init__(
        self,
        runner: ModelRunner,
        context: list[int],
        params: SamplingParams,
        prompt_len: int | None = None,
    ) -> None:
        """``context`` is the prompt followed by any tokens already committed (a moved session
        resumes this way); ``prompt_len`` says where the prompt ends (default: all of it)."""
        prompt_len = len(context) if prompt_len is None else prompt_len
        if not 0 < prompt_len <= len(context):
            raise ValueError(f"prompt_len must be in [1, {len(context)}], got {prompt_len}")
        if len(context) >= runner.max_length:
            raise ValueError(
                f"context has {len(context)} tokens; the model's context is {runner.max_length}"
            )
        self.runner = runner
        self.params = params
        self.prompt_len = prompt_len
        self.committed: list[int] = list(context)
        self.kv = runner.new_session()
        self.finish_reason: FinishReason | None = None
        self.stats = SpecStats()

    @property
    def generated(self) -> list[int]:
        return self.committed[self.prompt_len :]

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    def max_draft_len(self) -> int:
        """Most drafted tokens worth verifying now: leaves room for the emitted token within
        max_new_tokens and keeps every position inside the model's context."""
        by_length = self.params.max_drafts_after(len(self.generated))
        return max(0, min(by_length, self.runner.max_length - len(self.committed)))

    def verify(self, block: DraftBlock) -> Verdict:
        """Score ``block`` after the committed tokens and commit what the rule keeps."""
        if self.is_finished:
            raise InvalidDraft(f"generation already finished ({self.finish_reason.value})")
        self._check(block)
        k = block.num_tokens
        logits = self.kv.forward_to(self.committed + block.tokens, num_logits=k + 1)
        num_accepted, next_token = (int(x) for x in self._accept(block, logits))
        emitted = self._apply_limits(block.tokens[:num_accepted] + [next_token])
        self.committed += emitted
        self.stats.observe(k, num_accepted, len(emitted))
        return Verdict(num_accepted, emitted, len(self.committed), self.finish_reason)

    def _accept(self, block: DraftBlock, logits: torch.Tensor) -> AcceptResult:
        """logits: [k+1, vocab] for the last committed token and each drafted token."""
        k = block.num_tokens
        tokens = torch.tensor([block.tokens], dtype=torch.long).reshape(1, k)
        num_draft = torch.tensor([k])
        rule = resolve_rule(self.params, block.has_proposal)
        if rule is AcceptanceRule.GREEDY:
            return greedy_accept(tokens, num_draft, logits.unsqueeze(0))
        base, seed = len(self.committed), self.params.seed
        p = process_logits(logits, self.params).unsqueeze(0)  # [1, k+1, vocab]
        u_accept = position_uniforms(seed, base, k, STREAM_ACCEPT).unsqueeze(0)
        u_sample = position_uniforms(seed, base, k + 1, STREAM_SAMPLE).unsqueeze(0)
        if rule is AcceptanceRule.POINT_MASS:
            return point_mass_accept(tokens, num_draft, p, u_accept, u_sample)
        q = sparse_to_dense(block.q_ids, block.q_probs, p.shape[-1]).unsqueeze(0)
        return speculative_accept(tokens, num_draft, p, q, u_accept, u_sample)

    def _check(self, block: DraftBlock) -> None:
        k, vocab = block.num_tokens, self.runner.vocab_size
        if k > self.max_draft_len():
            raise InvalidDraft(f"block has {k} tokens; at most {self.max_draft_len()} fit now")
        if any(not 0 <= t < vocab for t in block.tokens):
            raise InvalidDraft(f"drafted token ids must be in [0, {vocab})")
        if block.has_proposal:
            _check_proposal(block, vocab)

    def _apply_limits(self, emitted: list[int]) -> list[int]:
        """Cut the round's tokens at the first stop token or at max_new_tokens."""
        for i, token in enumerate(emitted):
            if token in self.params.stop_token_ids:
                emitted = emitted[: i + 1]
                self.finish_reason = FinishReason.STOP
                break
        remaining = self.params.max_new_tokens - len(self.generated)
        if len(emitted) >= remaining:
            emitted = emitted[:remaining]
            self.finish_reason = self.finish_reason or FinishReason.LENGTH
        return emitted


def _check_proposal(block: DraftBlock, vocab: int) -> None:
    ids, probs = block.q_ids, block.q_probs
    if probs is None or ids.shape != probs.shape or ids.shape[0] != block.num_tokens:
        raise InvalidDraft("proposal ids and probs must both be [k, K] for the k drafted tokens")
    if bool((ids < 0).any() or (ids >= vocab).any()):
        raise InvalidDraft(f"proposal token ids must be in [0, {vocab})")
    if bool((probs < 0).any()) or not bool(torch.isfinite(probs).all()):
        raise InvalidDraft("proposal probabilities must be finite and non-negative")
    drafted = torch.tensor(block.tokens).unsqueeze(-1)
    mass_on_drafted = ((ids == drafted) * probs).sum(-1)  # [k]
    if bool((mass_on_drafted <= 0).any()):
        raise InvalidDraft("each drafted token must have positive probability in its proposal")

"""Plain data shared by drafters, verifiers and the in-process loop (no grpc, no torch models)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import torch


class AcceptanceRule(str, Enum):
    """How a verifier decides which drafted tokens to keep (see cascade.acceptance)."""

    GREEDY = "greedy"
    """Temperature 0: keep drafted tokens while they equal the target's argmax."""
    SPECULATIVE = "speculative"
    """Speculative sampling against the drafter's sparse proposal q (lossless)."""
    POINT_MASS = "point_mass"
    """Speculative sampling with q a point mass on each drafted token (lossless, no q needed)."""


class FinishReason(str, Enum):
    STOP = "stop"
    """A stop token (end of sequence) was generated."""
    LENGTH = "length"
    """max_new_tokens was reached."""


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are chosen; applied identically to the target (p) and the drafter (q)."""

    temperature: float = 0.0
    """0 selects greedy decoding; otherwise logits are divided by it. Range [0, 100]."""
    top_k: int = 0
    """Keep only the k most likely tokens; 0 keeps all."""
    top_p: float = 1.0
    """Keep the smallest set of tokens whose probability reaches top_p. Range (0, 1]."""
    seed: int = 0
    """Seeds the per-position random numbers, so a run is reproducible."""
    max_new_tokens: int = 64
    """Most tokens to generate after the prompt. At least 1."""
    stop_token_ids: tuple[int, ...] = ()
    """Generation ends after any of these tokens (it is kept in the output)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.temperature <= 100.0:
            raise ValueError(f"temperature must be in [0, 100], got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    def max_drafts_after(self, num_generated: int) -> int:
        """Drafted tokens worth verifying once ``num_generated`` tokens exist: every round also
        emits one token of the verifier's, and the total stops at max_new_tokens."""
        return max(0, self.max_new_tokens - num_generated - 1)


def resolve_rule(params: SamplingParams, has_proposal: bool) -> AcceptanceRule:
    """The acceptance rule a block is verified with: greedy at temperature 0, else by q's presence."""
    if params.is_greedy:
        return AcceptanceRule.GREEDY
    return AcceptanceRule.SPECULATIVE if has_proposal else AcceptanceRule.POINT_MASS


@dataclass
class DraftBlock:
    """k drafted tokens and, for sampling, the sparse proposal each was sampled from."""

    tokens: list[int]
    q_ids: torch.Tensor | None = None
    """[k, K] int64 token ids of the proposal support, most likely first."""
    q_probs: torch.Tensor | None = None
    """[k, K] float32 probabilities matching q_ids (zeros pad a smaller support)."""

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def has_proposal(self) -> bool:
        return self.q_ids is not None


@dataclass(frozen=True)
class Verdict:
    """The verifier's answer to one block."""

    num_accepted: int
    """Drafted tokens kept (a prefix of the block)."""
    tokens: list[int]
    """Tokens committed this round: the accepted ones plus the recovered or bonus token,
    cut short at a stop token or the length limit."""
    committed_len: int
    """Total committed length (prompt included) after this round."""
    finish_reason: FinishReason | None = None


@dataclass
class SpecStats:
    """Counters with vLLM's definitions (mean acceptance length includes the bonus token)."""

    num_drafts: int = 0
    """Rounds that verified at least one drafted token."""
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_target_passes: int = 0
    """Forward passes of the target after prefill (one per round)."""
    num_emitted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    def observe(self, num_draft: int, num_accepted: int, num_emitted: int) -> None:
        self.num_target_passes += 1
        self.num_emitted_tokens += num_emitted
        if num_draft == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_draft
        self.num_accepted_tokens += num_accepted
        if len(self.accepted_per_position) < num_draft:
            self.accepted_per_position += [0] * (num_draft - len(self.accepted_per_position))
        for i in range(num_accepted):
            self.accepted_per_position[i] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def tokens_per_target_pass(self) -> float:
        return self.num_emitted_tokens / self.num_target_passes if self.num_target_passes else 0.0

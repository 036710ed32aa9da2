"""Drafting: a small model proposes k tokens (and the sparse proposal q each was sampled from).

The drafter's cache follows the committed tokens by position (``KVSession.forward_to``): after a
verdict, the rejected tail is dropped and the next round starts from the committed sequence, so
the drafter needs no notion of what the verifier accepted beyond the tokens themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch

from cascade.ngram import ngram_propose
from cascade.runner import ModelRunner
from cascade.sampling import (
    STREAM_DRAFT,
    position_uniform,
    process_logits,
    sample_from,
    sparsify,
)
from cascade.types import DraftBlock, SamplingParams

MAX_DRAFT_TOKENS = 32


class DraftMethod(str, Enum):
    MODEL = "model"
    """The drafter model proposes every block."""
    NGRAM = "ngram"
    """Prompt lookup only: copy what followed the last match of the context's suffix."""
    NGRAM_THEN_MODEL = "ngram_then_model"
    """Prompt lookup when it finds a match, else the drafter model."""


@dataclass(frozen=True)
class DraftConfig:
    """How a drafter proposes blocks."""

    num_draft_tokens: int = 4
    """Tokens drafted per round (k), in [0, 32]; 0 means the target decodes alone."""
    max_proposal_tokens: int = 64
    """Cap on the support of the sparse proposal q sent per drafted token (top-K), in [1, 4096]."""
    send_proposal: bool = True
    """Send q with sampled drafts; without it the verifier treats q as a point mass."""
    min_confidence: float = 0.0
    """Stop a block early when the drafter's top probability falls below this, in [0, 1)."""
    method: DraftMethod = DraftMethod.MODEL
    ngram_max_n: int = 4
    """Longest context suffix prompt lookup tries to match."""
    ngram_min_n: int = 2
    """Shortest suffix it accepts as a match, in [1, ngram_max_n]."""

    def __post_init__(self) -> None:
        if not 0 <= self.num_draft_tokens <= MAX_DRAFT_TOKENS:
            raise ValueError(
                f"num_draft_tokens must be in [0, {MAX_DRAFT_TOKENS}], got {self.num_draft_tokens}"
            )
        if not 1 <= self.max_proposal_tokens <= 4096:
            raise ValueError(
                f"max_proposal_tokens must be in [1, 4096], got {self.max_proposal_tokens}"
            )
        if not 0.0 <= self.min_confidence < 1.0:
            raise ValueError(f"min_confidence must be in [0, 1), got {self.min_confidence}")
        if not 1 <= self.ngram_min_n <= self.ngram_max_n:
            raise ValueError(f"need 1 <= ngram_min_n <= ngram_max_n, got "
                             f"{self.ngram_min_n} and {self.ngram_max_n}")
        object.__setattr__(self, "method", DraftMethod(self.method))

    @property
    def uses_model(self) -> bool:
        return self.method is not DraftMethod.NGRAM


class DraftSession:
    """Drafts blocks for one generation with the drafter model's own KV cache."""

    def __init__(self, runner: ModelRunner | None, params: SamplingParams,
                 config: DraftConfig) -> None:
        if runner is None and config.uses_model:
            raise ValueError(f"draft method {config.method.value} needs a drafter model")
        self.params = params
        self.config = config
        self.kv = runner.new_session() if runner is not None else None

    def propose(self, committed: list[int], num_tokens: int | None = None) -> DraftBlock:
        """Draft up to ``num_tokens`` (default: the configured k) tokens after ``committed``."""
        k = self.config.num_draft_tokens if num_tokens is None else num_tokens
        if k == 0:
            return DraftBlock(tokens=[])
        if self.config.method is not DraftMethod.MODEL:
            c = self.config
            copied = ngram_propose(committed, k, c.ngram_max_n, c.ngram_min_n)
            if copied or not c.uses_model:
                return DraftBlock(tokens=copied)  # no q: verified as a point mass (lossless)
        return self._propose_with_model(committed, k)

    def _propose_with_model(self, committed: list[int], k: int) -> DraftBlock:
        logits = self.kv.forward_to(committed)[-1]  # [vocab]
        tokens, q_ids, q_probs = [], [], []
        for i in range(k):
            if i > 0 and self._is_unsure(logits):
                break
            token, ids, probs = self._choose(logits, len(committed) + i)
            tokens.append(token)
            q_ids.append(ids)
            q_probs.append(probs)
            if i < k - 1:
                logits = self.kv.extend([token])[-1]
        return self._block(tokens, q_ids, q_probs)

    def _is_unsure(self, logits: torch.Tensor) -> bool:
        if self.config.min_confidence <= 0.0:
            return False
        return float(torch.softmax(logits, dim=-1).max()) < self.config.min_confidence

    def _choose(self, logits: torch.Tensor, position: int):
        """One drafted token at ``position`` and the sparse q it was drawn from."""
        if self.params.is_greedy:
            return int(logits.argmax()), None, None
        probs = process_logits(logits.unsqueeze(0), self.params)  # [1, vocab]
        ids, values = sparsify(probs, self.config.max_proposal_tokens)  # [1, K] each
        uniform = position_uniform(self.params.seed, position, STREAM_DRAFT)
        column = int(sample_from(values, torch.tensor([uniform], dtype=torch.float64))[0])
        return int(ids[0, column]), ids[0], values[0]

    def _block(self, tokens: list[int], q_ids: list, q_probs: list) -> DraftBlock:
        if self.params.is_greedy or not self.config.send_proposal:
            return DraftBlock(tokens=tokens)
        return DraftBlock(tokens=tokens, q_ids=torch.stack(q_ids), q_probs=torch.stack(q_probs))

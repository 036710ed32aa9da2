"""The in-process speculative loop: drafter and target in one process.

This is the reference the distributed path must match token for token, and what benchmarks call
"Cascade in one process". With no drafter (or k = 0) it is plain target decoding through the very
same verification code.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from cascade.drafting import DraftConfig, DraftSession
from cascade.runner import ModelRunner
from cascade.types import DraftBlock, FinishReason, SamplingParams, SpecStats, Verdict
from cascade.verification import VerifySession


@dataclass
class RoundTiming:
    draft_s: float = 0.0
    """Seconds spent drafting (drafter forward passes and sampling)."""
    verify_s: float = 0.0
    """Seconds spent verifying (target forward pass and acceptance)."""


@dataclass
class Generation:
    tokens: list[int]
    """Generated token ids (prompt excluded)."""
    finish_reason: FinishReason | None
    stats: SpecStats
    timing: RoundTiming = field(default_factory=RoundTiming)
    elapsed_s: float = 0.0


def speculative_rounds(
    target: ModelRunner,
    prompt: list[int],
    params: SamplingParams,
    drafter: ModelRunner | None = None,
    config: DraftConfig | None = None,
    timing: RoundTiming | None = None,
) -> Iterator[tuple[DraftBlock, Verdict, VerifySession]]:
    """Run rounds until the generation finishes, yielding each block with its verdict."""
    config = config or DraftConfig()
    timing = timing if timing is not None else RoundTiming()
    verifier = VerifySession(target, prompt, params)
    wants_drafts = config.num_draft_tokens > 0 and (drafter is not None or not config.uses_model)
    drafts = DraftSession(drafter, params, config) if wants_drafts else None
    while not verifier.is_finished:
        started = time.perf_counter()
        num_tokens = min(config.num_draft_tokens, verifier.max_draft_len())
        block = drafts.propose(verifier.committed, num_tokens) if drafts else DraftBlock([])
        drafted = time.perf_counter()
        verdict = verifier.verify(block)
        timing.draft_s += drafted - started
        timing.verify_s += time.perf_counter() - drafted
        yield block, verdict, verifier


def generate(
    target: ModelRunner,
    prompt: list[int],
    params: SamplingParams,
    drafter: ModelRunner | None = None,
    config: DraftConfig | None = None,
) -> Generation:
    """Generate after ``prompt``; speculative when a drafter is given and k > 0."""
    started = time.perf_counter()
    timing = RoundTiming()
    verifier = None
    for _, _, verifier in speculative_rounds(target, prompt, params, drafter, config, timing):
        pass
    assert verifier is not None
    return Generation(
        tokens=verifier.generated,
        finish_reason=verifier.finish_reason,
        stats=verifier.stats,
        timing=timing,
        elapsed_s=time.perf_counter() - started,
    )

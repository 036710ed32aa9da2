"""The in-process speculative loop: drafter and target in one process.

This is the reference the distributed path must match token for token, and what benchmarks call
"Cascade in one process". With no drafter (or k = 0) it is plain target decoding through the very
same verification code.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from cascade.core.blocks import Draft, RoundOutcome, TargetFeatures
from cascade.core.verify.compiled import compile_target
from cascade.core.proposers import Proposer, ProposerContext, load, new_proposer
from cascade.core.model.runner import ModelRunner
from cascade.core.memory.suffix_index import SessionMemory
from cascade.core.verify.verification import SequenceVerifier
from cascade.protocol.settings import DraftConfig, FinishReason, SamplingParams
from cascade.protocol.acceptance import AcceptancePolicy
from cascade.protocol.stats import SpecStats


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


def _proposer(drafter: ModelRunner | None, params: SamplingParams, config: DraftConfig,
              policy: AcceptancePolicy, prompt_len: int,
              memory: SessionMemory | None) -> Proposer | None:
    """The proposer for this run, or None when the target decodes alone."""
    if config.num_draft_tokens == 0 or (drafter is None and load(config.method).needs_model):
        return None
    return new_proposer(ProposerContext(drafter, params, config, policy, prompt_len, memory))


def speculative_rounds(
    target: ModelRunner,
    prompt: list[int],
    params: SamplingParams,
    drafter: ModelRunner | None = None,
    config: DraftConfig | None = None,
    timing: RoundTiming | None = None,
    policy: AcceptancePolicy | None = None,
    memory: SessionMemory | None = None,
) -> Iterator[tuple[Draft, RoundOutcome, SequenceVerifier]]:
    """Run rounds until the generation finishes, yielding each draft with its outcome
    (``memory``: the speculation memory the suffix methods draft from)."""
    config = config or DraftConfig()
    timing = timing if timing is not None else RoundTiming()
    policy = policy or AcceptancePolicy.default_for(params, config)
    compile_target(target, os.environ.get("CASCADE_COMPILE", "off"))  # as the verifier does
    verifier = SequenceVerifier(target, prompt, params, policy=policy,
                                tree_room=config.tree_nodes if config.num_draft_tokens else 0)
    proposer = _proposer(drafter, params, config, policy, len(prompt), memory)
    if proposer is not None and proposer.wants_target_features:
        verifier.feature_layers = proposer.feature_layers
        _pass_features(proposer, verifier.prefill_features())
    try:
        while not verifier.is_finished:
            started = time.perf_counter()
            budget = config.budget(params, len(verifier.generated))
            draft = proposer.propose(verifier.committed, budget) if proposer else Draft([])
            drafted = time.perf_counter()
            outcome = verifier.verify(draft)
            timing.draft_s += drafted - started
            timing.verify_s += time.perf_counter() - drafted
            if proposer is not None:
                proposer.costs.observe("round_s", time.perf_counter() - drafted)
                proposer.judged(draft.source, draft.num_tokens, outcome.num_accepted)
            _pass_features(proposer, verifier.last_features)
            yield draft, outcome, verifier
    finally:
        verifier.close()


def _pass_features(proposer: Proposer | None, features: TargetFeatures | None) -> None:
    if proposer is not None and features is not None:
        proposer.observe(features)


def generate(
    target: ModelRunner,
    prompt: list[int],
    params: SamplingParams,
    drafter: ModelRunner | None = None,
    config: DraftConfig | None = None,
    policy: AcceptancePolicy | None = None,
    memory: SessionMemory | None = None,
) -> Generation:
    """Generate after ``prompt``; speculative when a drafter is given and k > 0."""
    started = time.perf_counter()
    timing = RoundTiming()
    verifier = None
    for _, _, verifier in speculative_rounds(target, prompt, params, drafter, config, timing,
                                             policy, memory):
        pass
    assert verifier is not None
    return Generation(
        tokens=verifier.generated,
        finish_reason=verifier.finish_reason,
        stats=verifier.stats,
        timing=timing,
        elapsed_s=time.perf_counter() - started,
    )

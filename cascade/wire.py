"""Conversions between the core's dataclasses and the cascade.v1 protobuf messages.

Only the generated ``*_pb2`` modules are imported here (they need protobuf, not grpc).
"""

from __future__ import annotations

import torch

from cascade.drafting import DraftConfig, DraftMethod
from cascade.types import DraftBlock, FinishReason, SamplingParams, Verdict
from cascade.v1 import common_pb2, verifier_pb2

FINISH_TO_PB = {
    None: common_pb2.FINISH_REASON_UNSPECIFIED,
    FinishReason.STOP: common_pb2.FINISH_REASON_STOP,
    FinishReason.LENGTH: common_pb2.FINISH_REASON_LENGTH,
}
FINISH_FROM_PB = {value: key for key, value in FINISH_TO_PB.items()}
METHOD_TO_PB = {
    DraftMethod.MODEL: common_pb2.DRAFT_METHOD_MODEL,
    DraftMethod.NGRAM: common_pb2.DRAFT_METHOD_NGRAM,
    DraftMethod.NGRAM_THEN_MODEL: common_pb2.DRAFT_METHOD_NGRAM_THEN_MODEL,
}
METHOD_FROM_PB = {value: key for key, value in METHOD_TO_PB.items()}
METHOD_FROM_PB[common_pb2.DRAFT_METHOD_UNSPECIFIED] = DraftMethod.MODEL


def sampling_to_pb(params: SamplingParams) -> common_pb2.SamplingParams:
    return common_pb2.SamplingParams(
        temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
        seed=params.seed, max_new_tokens=params.max_new_tokens,
        stop_token_ids=list(params.stop_token_ids),
    )


def sampling_from_pb(msg: common_pb2.SamplingParams) -> SamplingParams:
    """Raises ValueError naming the field when a value is out of range."""
    return SamplingParams(
        temperature=msg.temperature, top_k=msg.top_k, top_p=msg.top_p, seed=msg.seed,
        max_new_tokens=msg.max_new_tokens, stop_token_ids=tuple(msg.stop_token_ids),
    )


def draft_settings_to_pb(config: DraftConfig) -> common_pb2.DraftSettings:
    return common_pb2.DraftSettings(
        num_draft_tokens=config.num_draft_tokens,
        max_proposal_tokens=config.max_proposal_tokens,
        send_proposal=config.send_proposal,
        min_confidence=config.min_confidence,
        method=METHOD_TO_PB[config.method],
        ngram_max_n=config.ngram_max_n,
        ngram_min_n=config.ngram_min_n,
    )


def draft_settings_from_pb(msg: common_pb2.DraftSettings) -> DraftConfig:
    defaults = DraftConfig()
    if msg.method not in METHOD_FROM_PB:
        raise ValueError(f"unknown draft method {msg.method}")
    return DraftConfig(
        num_draft_tokens=msg.num_draft_tokens,
        max_proposal_tokens=msg.max_proposal_tokens,
        send_proposal=msg.send_proposal,
        min_confidence=msg.min_confidence,
        method=METHOD_FROM_PB[msg.method],
        ngram_max_n=msg.ngram_max_n or defaults.ngram_max_n,
        ngram_min_n=msg.ngram_min_n or defaults.ngram_min_n,
    )


def block_to_pb(block: DraftBlock, **fields) -> verifier_pb2.DraftBlock:
    """``fields``: session_id, epoch, round, base_len, draft_us."""
    msg = verifier_pb2.DraftBlock(tokens=block.tokens, **fields)
    if block.has_proposal:
        for ids, probs in zip(block.q_ids.tolist(), block.q_probs.tolist()):
            support = [(i, p) for i, p in zip(ids, probs) if p > 0]
            msg.proposals.add(token_ids=[i for i, _ in support], probs=[p for _, p in support])
    return msg


def block_from_pb(msg: verifier_pb2.DraftBlock) -> DraftBlock:
    """Ragged proposals are padded with probability 0 into [k, K] tensors."""
    tokens = list(msg.tokens)
    if not msg.proposals:
        return DraftBlock(tokens=tokens)
    width = max(len(p.token_ids) for p in msg.proposals)
    ids = torch.zeros(len(msg.proposals), width, dtype=torch.long)
    probs = torch.zeros(len(msg.proposals), width, dtype=torch.float32)
    for row, proposal in enumerate(msg.proposals):
        if len(proposal.token_ids) != len(proposal.probs):
            raise ValueError(f"proposal {row}: token_ids and probs differ in length")
        ids[row, : len(proposal.token_ids)] = torch.tensor(proposal.token_ids, dtype=torch.long)
        probs[row, : len(proposal.probs)] = torch.tensor(proposal.probs, dtype=torch.float32)
    return DraftBlock(tokens=tokens, q_ids=ids, q_probs=probs)


def round_to_pb(verdict: Verdict, round_number: int, num_drafted: int) -> common_pb2.Round:
    return common_pb2.Round(
        round=round_number, tokens=verdict.tokens, num_accepted=verdict.num_accepted,
        num_drafted=num_drafted, committed_len=verdict.committed_len,
        finish_reason=FINISH_TO_PB[verdict.finish_reason],
    )

"""Drafts and verdicts as messages: the core's tensors to and from cascade.v1 protobuf.

The verdict is what the verifier tells the drafter; the Round is what the drafter tells the
gateway. Each side builds its own message, so what only the drafter needs never reaches the
gateway.
"""

from __future__ import annotations

import torch

from cascade.core.blocks import Draft, RoundOutcome
from cascade.protocol.wire import FINISH_TO_PB
from cascade.v1 import common_pb2, verifier_pb2


def draft_to_pb(draft: Draft, **fields) -> verifier_pb2.DraftBlock:
    """``fields``: session_id, epoch, round, base_len, draft_us."""
    msg = verifier_pb2.DraftBlock(tokens=draft.tokens, **fields)
    if draft.has_proposal:
        for ids, probs in zip(draft.q_ids.tolist(), draft.q_probs.tolist()):
            support = [(i, p) for i, p in zip(ids, probs) if p > 0]
            msg.proposals.add(token_ids=[i for i, _ in support], probs=[p for _, p in support])
    return msg


def draft_from_pb(msg: verifier_pb2.DraftBlock) -> Draft:
    """Ragged proposals are padded with probability 0 into [k, K] tensors."""
    tokens = list(msg.tokens)
    if not msg.proposals:
        return Draft(tokens=tokens)
    width = max(len(p.token_ids) for p in msg.proposals)
    ids = torch.zeros(len(msg.proposals), width, dtype=torch.long)
    probs = torch.zeros(len(msg.proposals), width, dtype=torch.float32)
    for row, proposal in enumerate(msg.proposals):
        if len(proposal.token_ids) != len(proposal.probs):
            raise ValueError(f"proposal {row}: token_ids and probs differ in length")
        ids[row, : len(proposal.token_ids)] = torch.tensor(proposal.token_ids, dtype=torch.long)
        probs[row, : len(proposal.probs)] = torch.tensor(proposal.probs, dtype=torch.float32)
    return Draft(tokens=tokens, q_ids=ids, q_probs=probs)


def verdict_to_pb(outcome: RoundOutcome, verify_us: int, **fields) -> verifier_pb2.Verdict:
    """``fields``: session_id, epoch, round."""
    return verifier_pb2.Verdict(
        tokens=outcome.tokens, num_accepted=outcome.num_accepted,
        committed_len=outcome.committed_len, finish_reason=FINISH_TO_PB[outcome.finish_reason],
        verify_us=verify_us, **fields)


def round_from_verdict(verdict: verifier_pb2.Verdict, num_drafted: int, draft_us: int,
                       round_us: int) -> common_pb2.Round:
    """What the drafter streams to the gateway for one verified block."""
    return common_pb2.Round(
        round=verdict.round, tokens=verdict.tokens, num_accepted=verdict.num_accepted,
        num_drafted=num_drafted, committed_len=verdict.committed_len,
        finish_reason=verdict.finish_reason, draft_us=draft_us, verify_us=verdict.verify_us,
        round_us=round_us)

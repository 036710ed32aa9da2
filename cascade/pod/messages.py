"""Drafts and verdicts as messages: the core's tensors to and from cascade.v1 protobuf.

The verdict is what the verifier tells the drafter; the Round is what the drafter tells the
gateway. Each side builds its own message, so what only the drafter needs never reaches the
gateway.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from cascade.core.blocks import Draft, RoundOutcome, TargetFeatures
from cascade.core.plan.speculation import Outcome
from cascade.protocol.round_stats import RoundStats
from cascade.protocol.wire.validation import ModelLimits, check_block
from cascade.protocol.wire.convert import FINISH_TO_PB, logprobs_to_pb
from cascade.session.wire import FEATURE_CHUNK_POSITIONS, num_open_replies
from cascade.v1 import common_pb2, verifier_pb2


def draft_to_pb(draft: Draft, **fields) -> verifier_pb2.DraftBlock:
    """``fields``: session_id, epoch, round, base_len, draft_us."""
    source = draft.source or ("model" if draft.tokens else "")
    msg = verifier_pb2.DraftBlock(tokens=draft.tokens, parents=draft.parents or (),
                                  source=source, survival=draft.survival or (), **fields)
    if draft.q_ids is not None and draft.q_probs is not None:
        _add_sparse(msg.proposals, draft.q_ids, draft.q_probs)
    if draft.decision_ids is not None and draft.decision_probs is not None:
        _add_sparse(msg.decision_proposals, draft.decision_ids, draft.decision_probs)
    return msg


def _add_sparse(rows, ids: torch.Tensor, probs: torch.Tensor) -> None:
    """One SparseDistribution per row of [k, K] ids and probs, without the zero padding."""
    for row_ids, row_probs in zip(ids.tolist(), probs.tolist()):
        support = [(i, p) for i, p in zip(row_ids, row_probs) if p > 0]
        rows.add(token_ids=[i for i, _ in support], probs=[p for _, p in support])


def model_limits(runner) -> ModelLimits:
    """What the pod's model (a ModelRunner or a FeatureRunner) accepts on the wire."""
    return ModelLimits(runner.vocab_size, runner.max_length, getattr(runner, "num_layers", 0))


def draft_from_pb(msg: verifier_pb2.DraftBlock, vocab_size: int) -> Draft:
    """Checks the block's sizes and values (``check_block``), then pads ragged proposals with
    probability 0 into [k, K] tensors."""
    check_block(msg, vocab_size)
    q_ids, q_probs = _padded(msg.proposals)
    decision_ids, decision_probs = _padded(msg.decision_proposals)
    return Draft(list(msg.tokens), q_ids, q_probs, decision_ids, decision_probs,
                 list(msg.parents) or None, msg.source, list(msg.survival) or None)


def _padded(rows) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """[k, K] ids and probs of checked sparse rows, padded with probability 0 (None: no rows)."""
    if not rows:
        return None, None
    width = max(len(p.token_ids) for p in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)  # [k, K]
    probs = torch.zeros(len(rows), width, dtype=torch.float32)  # [k, K]
    for row, proposal in enumerate(rows):
        ids[row, : len(proposal.token_ids)] = torch.tensor(proposal.token_ids, dtype=torch.long)
        probs[row, : len(proposal.probs)] = torch.tensor(proposal.probs, dtype=torch.float32)
    return ids, probs


def verdict_to_pb(outcome: RoundOutcome, verify_us: int, features: TargetFeatures | None = None,
                  **fields) -> verifier_pb2.Verdict:
    """``fields``: session_id, epoch, round."""
    stats = RoundStats(num_accepted=outcome.num_accepted, num_deferred=outcome.num_deferred,
                       num_forced=outcome.num_forced, num_filled=outcome.num_filled,
                       verify_us=verify_us)
    return verifier_pb2.Verdict(
        tokens=outcome.tokens, committed_len=outcome.committed_len,
        finish_reason=FINISH_TO_PB[outcome.finish_reason], features=features_to_pb(features),
        path=outcome.path or (), logprobs=logprobs_to_pb(outcome.logprobs or ()),
        prompt_logprobs=logprobs_to_pb(outcome.prompt_logprobs or ()), stats=stats.to_pb(),
        **fields)


def features_to_pb(features: TargetFeatures | None) -> verifier_pb2.TargetFeatures | None:
    if features is None:
        return None
    values = features.hidden_states.detach().to(torch.float16).contiguous()
    return verifier_pb2.TargetFeatures(start=features.start, shape=list(values.shape),
                                       dtype="float16", data=values.numpy().tobytes())


def features_from_pb(msg: verifier_pb2.TargetFeatures) -> TargetFeatures:
    if msg.dtype != "float16" or len(msg.shape) != 2:
        raise ValueError(f"features must be 2-D float16, got {msg.dtype} {list(msg.shape)}")
    rows, columns = msg.shape
    if len(msg.data) != rows * columns * 2:
        raise ValueError(f"features: {len(msg.data)} bytes do not hold a {rows}x{columns} block")
    values = torch.frombuffer(bytearray(msg.data), dtype=torch.float16).reshape(rows, columns)
    return TargetFeatures(msg.start, values.float())


def context_feature_chunks(features: TargetFeatures | None, context_len: int
                           ) -> list[TargetFeatures | None]:
    """The replies to a SessionOpen that asked for features: ``num_open_replies`` chunks."""
    if features is None:
        return [None] * num_open_replies(context_len)
    rows = features.hidden_states
    return [TargetFeatures(start, rows[start : start + FEATURE_CHUNK_POSITIONS])
            for start in range(0, len(rows), FEATURE_CHUNK_POSITIONS)] or [None]


def round_from_verdict(verdict: verifier_pb2.Verdict, drafted: Sequence[int], draft_us: int,
                       round_us: int, parents: Sequence[int] = (), source: str = ""
                       ) -> common_pb2.Round:
    """What the drafter streams to the gateway for one verified block (``drafted``: the
    block's tokens, rejected ones included; ``parents``: a tree's, empty for a chain;
    ``source``: what drafted it): the verdict's statistics with the drafter's added."""
    stats = common_pb2.RoundStats(num_drafted=len(drafted), draft_us=draft_us,
                                  round_us=round_us, draft_source=source if drafted else "")
    stats.MergeFrom(verdict.stats)
    return common_pb2.Round(
        round=verdict.round, tokens=verdict.tokens, committed_len=verdict.committed_len,
        finish_reason=verdict.finish_reason, drafted_tokens=drafted, drafted_parents=parents,
        path=verdict.path, logprobs=verdict.logprobs, prompt_logprobs=verdict.prompt_logprobs,
        stats=stats)


def verdict_outcome(verdict: verifier_pb2.Verdict) -> Outcome | None:
    """What a verdict decided, as a block sent ahead guesses it (None: it committed nothing):
    the accepted count, the verifier's own token (before any it filled in) and, after a token
    tree, the accepted path. A block sent
    ahead is the next round's only when its ``base_len`` is also the verdict's committed
    length (``follows``): a guess may not foresee the filled tokens."""
    own = len(verdict.tokens) - 1 - verdict.stats.num_filled
    if own < 0:
        return None
    return Outcome(verdict.stats.num_accepted, verdict.tokens[own], tuple(verdict.path))


def follows(block: verifier_pb2.DraftBlock, verdict: verifier_pb2.Verdict) -> bool:
    """Whether ``block`` was drafted after the committed tokens ``verdict`` leaves."""
    return block.base_len == verdict.committed_len


def assumed_outcome(block: verifier_pb2.DraftBlock) -> Outcome | None:
    """The outcome a block sent ahead assumes (None: an ordinary block)."""
    if not block.HasField("assumes"):
        return None
    assumes = block.assumes
    return Outcome(assumes.num_accepted, assumes.next_token, tuple(assumes.path))


def tag_block(block: verifier_pb2.DraftBlock, outcome: Outcome) -> verifier_pb2.DraftBlock:
    """A copy of ``block`` that assumes ``outcome`` (to send ahead of the verdict)."""
    tagged = verifier_pb2.DraftBlock()
    tagged.CopyFrom(block)
    tagged.assumes.num_accepted, tagged.assumes.next_token = (outcome.num_accepted,
                                                              outcome.next_token)
    tagged.assumes.path[:] = outcome.path
    return tagged

"""Blocks sent ahead of the verdict they assume (``DraftBlock.assumes``, speculative
speculative decoding): which one the verifier takes, and as what."""

from __future__ import annotations

from cascade.pod.messages import assumed_outcome, follows, verdict_outcome
from cascade.v1 import verifier_pb2


def guessed_right(session, block: verifier_pb2.DraftBlock,
                  verdict: verifier_pb2.Verdict | None) -> bool:
    """Whether a block sent ahead assumes the outcome ``verdict`` decided, and is the round
    after it (``verdict``: the round just verified, or, while the session catches up, the
    verdict that asked for the block on its way)."""
    return (verdict is not None and not session.sequence.is_finished
            and block.epoch == session.epoch and block.round == verdict.round + 1
            and assumed_outcome(block) == verdict_outcome(verdict) and follows(block, verdict))


def untagged(block: verifier_pb2.DraftBlock) -> verifier_pb2.DraftBlock:
    """A block sent ahead on the right guess, as the plain block it stands for (drafted while
    the round before was verified)."""
    plain = verifier_pb2.DraftBlock()
    plain.CopyFrom(block)
    plain.ClearField("assumes")
    plain.predrafted = True
    return plain

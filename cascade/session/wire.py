"""What the conversation reads from its messages (cascade.v1 protobuf, no model code): when a
verdict ends the generation, how many replies an open gets, what a block sent before rounds
decoded alone still holds."""

from __future__ import annotations

from cascade.v1 import common_pb2, verifier_pb2

FEATURE_CHUNK_POSITIONS = 2048
"""Positions of context features per reply to an open that asked for them (2048 x 1728 float16
= 7 MB for SmolLM2-135M, inside the 16 MB message limit)."""


def ends_generation(verdict: verifier_pb2.Verdict) -> bool:
    """Whether the verdict's round is the generation's last (it carries a finish reason)."""
    return verdict.finish_reason != common_pb2.FINISH_REASON_UNSPECIFIED


def num_open_replies(context_len: int) -> int:
    """Verdicts carrying the context's target features that answer an open asking for them."""
    return max(1, -(-(context_len - 1) // FEATURE_CHUNK_POSITIONS))


def tokens_after(block: verifier_pb2.DraftBlock, done: list[int]) -> list[int]:
    """A greedy chain's tokens after ``done``, tokens committed since its ``base_len`` (rounds
    decoded alone while it was on its way): the rest, if its first tokens equal them (then the
    rest is the drafter's continuation of the longer context), else none."""
    tokens = list(block.tokens)
    return tokens[len(done):] if tokens[:len(done)] == done else []


def num_verified(verdict: verifier_pb2.Verdict, block: verifier_pb2.DraftBlock) -> int:
    """The block's tokens the verdict verified: all, unless the planning verifier cut it."""
    return verdict.num_verified if verdict.HasField("num_verified") else len(block.tokens)

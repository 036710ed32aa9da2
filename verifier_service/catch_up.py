"""Catching up: a planned session the plan sends back to drafting, among sessions the verifier
keeps stepping, is decoded alone while its block is on its way, so it misses no step for its
drafter's round trip; the block, drafted before those rounds, is verified from where they leave
it. Exact for a greedy chain drafted from tokens alone: its tokens after a context it agrees with
are the drafter's greedy continuation of that context."""

from __future__ import annotations

from collections.abc import Iterable

from cascade.session.wire import tokens_after
from cascade.v1 import verifier_pb2


def catches_up(planner, session, sessions: Iterable) -> bool:
    """Whether to decode ``session`` alone while the block it was asked for is on its way
    (``DraftPlanner.catches_up``): only while another of ``sessions`` keeps the verifier
    stepping (one the plan did not send to draft), else the verifier would run a pass it need
    not and verify the block a step later."""
    if session.sequence.is_finished or not planner.catches_up(session.sequence):
        return False
    return any(not planner.is_drafting(other.sequence) for other in sessions
               if other is not session)


def rebased(planner, session, block: verifier_pb2.DraftBlock) -> verifier_pb2.DraftBlock:
    """``block``, drafted before the rounds decoded alone since it was asked for, from where
    they leave it: its tokens past them if its first ones equal them, else none (that round is
    decoded alone too). Its tokens at committed positions count as a shadow block."""
    done = session.sequence.committed[block.base_len:]
    planner.shadow(session.sequence, block.base_len, list(block.tokens[:len(done)]))
    out = verifier_pb2.DraftBlock()
    out.CopyFrom(block)
    out.base_len, out.round = block.base_len + len(done), session.last_round + 1
    cut = len(block.tokens) - len(tokens_after(block, done))
    for per_token in (out.tokens, out.proposals, out.decision_proposals, out.survival):
        del per_token[:cut]  # each token's own values go with it
    return out

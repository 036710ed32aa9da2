"""What a verifier checks in a draft before it feeds it: its length, its ids, its proposals and,
for a token tree, its shape and rule. A failure is an ``InvalidDraft`` naming the field."""

from __future__ import annotations

import torch

from cascade.core.blocks import Draft
from cascade.protocol.limits import MAX_TREE_NODES
from cascade.protocol.acceptance import TREE_RULES, AcceptanceRule
from cascade.protocol.trees import tree_problem


class InvalidDraft(ValueError):
    """A draft that cannot be verified as sent (a caller mistake, not a server fault)."""


def check_draft(draft: Draft, rule: AcceptanceRule, vocab: int, max_len: int, room: int
                ) -> None:
    """``max_len``: most drafted tokens worth verifying now; ``room``: KV positions left."""
    k = draft.num_tokens
    if k > max_len and draft.parents is None:
        raise InvalidDraft(f"tokens: block has {k} tokens; at most {max_len} fit now")
    if any(not 0 <= t < vocab for t in draft.tokens):
        raise InvalidDraft(f"tokens: drafted token ids must be in [0, {vocab})")
    if draft.has_proposal and rule is AcceptanceRule.POINT_MASS:
        raise InvalidDraft("proposals: the session's acceptance rule is point_mass: send no "
                           "proposal")
    needs_q = not rule.is_lossless or rule is AcceptanceRule.RECURSIVE
    if k and not draft.has_proposal and needs_q:
        raise InvalidDraft(f"proposals: acceptance rule {rule.value} needs the "
                           "drafter's q with every block")
    if draft.has_proposal:
        _check_proposal(draft, vocab)
    if draft.parents is not None:
        _check_tree(draft, rule, max_len, room)


def _check_tree(draft: Draft, rule: AcceptanceRule, max_len: int, room: int) -> None:
    if rule not in TREE_RULES:
        raise InvalidDraft(f"parents: a token tree is verified with the greedy, keyed or "
                           f"recursive rule; the session's rule is {rule.value}: send a chain")
    if len(draft.parents) != draft.num_tokens:
        raise InvalidDraft(f"parents: {len(draft.parents)} parents for "
                           f"{draft.num_tokens} tokens; one per token")
    problem = tree_problem(draft.parents, min(MAX_TREE_NODES, room), max_len)
    if problem is not None:
        raise InvalidDraft(f"parents: {problem}")


def _check_proposal(draft: Draft, vocab: int) -> None:
    ids, probs = draft.q_ids, draft.q_probs
    if probs is None or ids.shape != probs.shape or ids.shape[0] != draft.num_tokens:
        raise InvalidDraft("proposals: ids and probs must both be [k, K] for the k drafted tokens")
    if bool((ids < 0).any() or (ids >= vocab).any()):
        raise InvalidDraft(f"proposals: token ids must be in [0, {vocab})")
    if bool((probs < 0).any()) or not bool(torch.isfinite(probs).all()):
        raise InvalidDraft("proposals: probabilities must be finite and non-negative")
    drafted = torch.tensor(draft.tokens).unsqueeze(-1)
    mass_on_drafted = ((ids == drafted) * probs).sum(-1)  # [k]
    if bool((mass_on_drafted <= 0).any()):
        raise InvalidDraft("proposals: each drafted token must have positive probability in its "
                           "proposal")

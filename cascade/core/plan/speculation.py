"""Guessing a round's outcome before its verdict (speculative speculative decoding, "Saguaro").

A round's outcome is (a, t): the verifier accepts the first a drafted tokens and then commits its
own token t (the recovered token at position a, or the bonus token when a = k). While the block is
verified, the drafter pre-drafts the next block for its likeliest outcomes. The drafter's own
distributions rank them: with q_i its distribution at drafted position i (i = k: the bonus
position) and d_i the drafted tokens,

    score(a, t) = q_0(d_0) ... q_{a-1}(d_{a-1}) * q_a(t),    t != d_a,

the drafter's chance that the first a drafts survive and the target then picks t. Each position
offers its top ``fanout`` tokens other than the drafted one, so the guesses per position fall
geometrically with the prefix product: later positions get fewer useful guesses without a
separate schedule, and ``max_blocks`` caps the total.

A token tree's outcome is (path, t): the accepted path (root-to-node, possibly empty), then the
verifier's token t after its last node. The same rule ranks it: the product of q along the path
times q(t) at the node's children's position, t not among the node's children (a child carrying
t would have been accepted instead). A chain is the tree whose node i is node i - 1's only child.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from cascade.core.trees import children, path_to
from cascade.protocol.settings import SamplingParams
from cascade.protocol.trees import chain_parents


@dataclass(frozen=True, order=True)
class Outcome:
    """What verifying one block decided, as far as the next block depends on it."""

    num_accepted: int
    next_token: int
    path: tuple[int, ...] = ()
    """A tree's accepted nodes (indices into its tokens, from a root child down, as the verdict
    names them; ``num_accepted`` of them); empty for a chain (its first ``num_accepted``)."""

    def accepted(self, drafted: Sequence[int]) -> list[int]:
        """The drafted tokens this outcome accepts."""
        if self.path:
            return [drafted[node] for node in self.path]
        return list(drafted[: self.num_accepted])

    def context(self, committed: list[int], drafted: Sequence[int]) -> list[int]:
        """The committed tokens after a block of ``drafted`` tokens ended this way."""
        return committed + self.accepted(drafted) + [self.next_token]


@dataclass(frozen=True)
class Guess:
    score: float
    outcome: Outcome


def rank_outcomes(probs: torch.Tensor, drafted: list[int], fanout: int, max_guesses: int,
                  parents: Sequence[int] | None = None) -> list[Guess]:
    """The likeliest outcomes of a block, best first.

    ``probs``: [len(drafted) + 1, vocab] the drafter's distribution after the committed tokens
    (row 0) and after each drafted node (row i + 1; for a chain the position after drafted
    token i, the last row the bonus position). ``parents``: a tree's (None: a chain; its
    outcomes name no path)."""
    if fanout <= 0 or max_guesses <= 0:
        return []
    layout = chain_parents(len(drafted)) if parents is None else list(parents)
    reach = _reach(probs, drafted, layout)  # [n + 1]: each row's node reached and accepted
    open_probs = probs.clone()  # [n + 1, vocab]
    for row, kids in enumerate(children(layout)):
        open_probs[row, [drafted[k] for k in kids]] = -1.0  # a child's token is accepted
    values, ids = open_probs.topk(min(fanout, probs.shape[-1]), dim=-1)  # [n + 1, fanout]
    scores = (reach[:, None] * values).tolist()
    valid, ids = (values >= 0).tolist(), ids.tolist()
    guesses = []
    for row, (row_scores, row_ids, row_valid) in enumerate(zip(scores, ids, valid)):
        path = tuple(path_to(layout, row - 1))
        outcome_path = path if parents is not None else ()
        guesses += [Guess(s, Outcome(len(path), t, outcome_path))
                    for s, t, ok in zip(row_scores, row_ids, row_valid) if ok]
    guesses.sort(key=lambda g: (-g.score, g.outcome))
    return guesses[:max_guesses]


def _reach(probs: torch.Tensor, drafted: list[int], parents: list[int]) -> torch.Tensor:
    """[n + 1] float64: 1 for the root, then for each node the product of q along its path."""
    picked = probs[torch.tensor(parents, dtype=torch.long) + 1,
                   torch.tensor(drafted, dtype=torch.long)].tolist() if drafted else []
    reach = [1.0]
    for node, parent in enumerate(parents):
        reach.append(reach[parent + 1] * picked[node])
    return torch.tensor(reach, dtype=torch.float64)


def ends_generation(outcome: Outcome, drafted: list[int], context_len: int, prompt_len: int,
                    sampling: SamplingParams) -> bool:
    """Whether a round ending this way (committed length ``context_len`` after it) finishes
    the generation (a stop token among its tokens, or the length limit): no block follows."""
    new = outcome.accepted(drafted) + [outcome.next_token]
    return (any(t in sampling.stop_token_ids for t in new)
            or context_len - prompt_len >= sampling.max_new_tokens)

"""Acceptance on a token tree: walk from the root while the target's own choice is a child.

At every node the target makes the choice it would make decoding alone at that position: the
argmax (greedy) or, with the position-keyed rule, argmax(log p + noise of the position), the
noise a pure function of (seed, position, token id) (``cascade.core.sample.sampling.gumbel_noise``).
The walk descends into the child carrying that choice; where no child does, the choice is the
round's last token (the correction; at a leaf, the bonus). So the tokens a round commits are
exactly those decoding alone would produce, for any tree: greedy equals the target's greedy
decoding, and a keyed session's text depends on its prompt and seed alone (the SpecExec
validation rule with noise keyed by position).

A chain is the tree whose parents are -1, 0, 1, ...: the same walk accepts the longest prefix
whose tokens are the target's choices.

The recursive rule (``walk_recursive``, SpecInfer's multi-step speculative sampling) is the
sampled alternative that uses q: at a node whose children were sampled in order, child j from
its own q_j (the drafter draws without replacement: q_j is the node's q without the earlier
siblings, renormalised; i.i.d. draws with q_j = q are exact too), child j is accepted with
probability min(1, r(x_j) / q_j(x_j)), r starting as the target's p at the node and becoming
norm(max(r - q_j, 0)) after each rejection; when every child is rejected the round's last token
is drawn from r. Each step emits exactly a sample of p
(``recursive_siblings``; N = 200,000 in the tests).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from cascade.core.sample.sampling import (
    STREAM_SAMPLE,
    STREAM_SIBLING_ACCEPT,
    keyed_choice,
    position_uniform,
    process_logits,
    sample_from,
)
from cascade.core.trees import children
from cascade.protocol.settings import SamplingParams
from cascade.protocol.trees import chain_parents, depths


class TreeVerdict(NamedTuple):
    path: list[int]
    """Accepted node indices, from a root child down."""
    next_token: int
    """The target's choice after the path (the correction, or the bonus at a leaf)."""


def target_choices(logits: torch.Tensor, sampling: SamplingParams,
                   noise: torch.Tensor | None) -> torch.Tensor:
    """The target's choice after the root and after each node: [n+1] from logits [n+1, vocab]
    and, for the keyed rule, the noise of each row's position [n+1, vocab] (None: greedy)."""
    if noise is None:
        return logits.argmax(dim=-1)
    return keyed_choice(process_logits(logits, sampling), noise)


def walk(parents: list[int], tokens: list[int], choices: list[int]) -> TreeVerdict:
    """The accepted path given the target's choice at the root (``choices[0]``) and after each
    node (``choices[i + 1]``)."""
    kids, path, node = children(parents), [], -1
    while True:
        choice = choices[node + 1]
        child = next((c for c in kids[node + 1] if tokens[c] == choice), None)
        if child is None:
            return TreeVerdict(path, choice)
        path.append(child)
        node = child


def row_depths(parents: list[int]) -> list[int]:
    """The depth of the root's row (0) and of each node's row: row r's logits predict position
    base + depth."""
    return [0] + depths(parents)


def recursive_siblings(p: torch.Tensor, q: torch.Tensor, children: torch.Tensor,
                       num_children: torch.Tensor, u_accept: torch.Tensor,
                       u_sample: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One node per row: which of its children is accepted and the token emitted there.

    p: [N, vocab] the target's distribution at the node; q: [N, m, vocab] the proposal each
    child was sampled from; children: [N, m] their tokens (padding past ``num_children`` [N]);
    u_accept: [N, m] and u_sample: [N] float64 uniforms. Returns (the accepted child's index,
    -1 when none, [N]; the emitted token [N]).
    """
    rows = torch.arange(p.shape[0])
    residual = p.double().clone()
    accepted = torch.full((p.shape[0],), -1, dtype=torch.long)
    for j in range(children.shape[1]):
        active = (accepted < 0) & (j < num_children)
        token, q_j = children[:, j].clamp_min(0), q[:, j].double()
        take = active & (u_accept[:, j] * q_j[rows, token] < residual[rows, token])
        accepted[take] = j
        rest = (residual - q_j).clamp_min(0.0)
        mass = rest.sum(-1, keepdim=True)
        rest = torch.where(mass > 0, rest / mass.clamp_min(1e-300), residual)
        residual = torch.where((active & ~take)[:, None], rest, residual)
    drawn = sample_from(residual, u_sample)
    if children.shape[1] == 0:  # a leaf: the bonus token
        return accepted, drawn
    chosen = children.gather(1, accepted.clamp_min(0)[:, None]).squeeze(1)
    return accepted, torch.where(accepted >= 0, chosen, drawn)


def walk_recursive(parents: list[int], tokens: list[int], p: torch.Tensor, q: torch.Tensor,
                   seed: int, base: int) -> TreeVerdict:
    """The recursive rule's walk: p [n+1, vocab] the target's processed distribution after the
    root and after each node, q [n, vocab] the proposal each node was sampled from; the node
    tried j-th at position t uses uniform (seed, t, STREAM_SIBLING_ACCEPT + j)."""
    kids, node_depths, path, node = children(parents), [0] + depths(parents), [], -1
    while True:
        position, siblings = base + node_depths[node + 1], kids[node + 1]
        u_accept = torch.tensor([[position_uniform(seed, position, STREAM_SIBLING_ACCEPT + j)
                                  for j in range(len(siblings))]], dtype=torch.float64)
        u_sample = torch.tensor([position_uniform(seed, position, STREAM_SAMPLE)],
                                dtype=torch.float64)
        index, token = recursive_siblings(
            p[node + 1][None], q[siblings][None] if siblings else q[:0][None],
            torch.tensor([[tokens[c] for c in siblings]], dtype=torch.long).reshape(1, -1),
            torch.tensor([len(siblings)]), u_accept.reshape(1, -1), u_sample)
        if int(index[0]) < 0:
            return TreeVerdict(path, int(token[0]))
        node = siblings[int(index[0])]
        path.append(node)


def shadow_path(tokens: Sequence[int], parents: Sequence[int] | None,
                truth: Sequence[int]) -> list[int]:
    """The nodes a greedy walk accepts when the target's choices are the committed tokens
    ``truth`` (past them nothing matches): how a shadow block is scored."""
    parents = list(parents) if parents is not None else chain_parents(len(tokens))
    choices = [truth[d] if d < len(truth) else -1 for d in row_depths(parents)]
    return walk(parents, list(tokens), choices).path

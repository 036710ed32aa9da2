"""Acceptance on a token tree: walk from the root while the target's own choice is a child.

At every node the target makes the choice it would make decoding alone at that position: the
argmax (greedy) or, with the position-keyed rule, argmax(log p + noise of the position), the
noise a pure function of (seed, position, token id) (``cascade.core.sampling.gumbel_noise``).
The walk descends into the child carrying that choice; where no child does, the choice is the
round's last token (the correction; at a leaf, the bonus). So the tokens a round commits are
exactly those decoding alone would produce, for any tree: greedy equals the target's greedy
decoding, and a keyed session's text depends on its prompt and seed alone (the SpecExec
validation rule with noise keyed by position).

A chain is the tree whose parents are -1, 0, 1, ...: the same walk accepts the longest prefix
whose tokens are the target's choices.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from cascade.core.sampling import keyed_choice, process_logits
from cascade.core.trees import children, depths
from cascade.protocol.settings import SamplingParams


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

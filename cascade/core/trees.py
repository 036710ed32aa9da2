"""Token trees on the torch side: each node's children, its path and the attention mask among
nodes (the layout and its checks, torch-free, are ``cascade.protocol.trees``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch


def children(parents: Sequence[int]) -> list[list[int]]:
    """Children of the root (index 0) and of each node (index i + 1), in node order."""
    out: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for i, parent in enumerate(parents):
        out[parent + 1].append(i)
    return out


def path_to(parents: Sequence[int], node: int) -> list[int]:
    """Node indices from a root child down to ``node`` (empty for the root, node -1)."""
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def ancestor_mask(parents: Sequence[int]) -> torch.Tensor:
    """[n, n] bool: True where node i sees node j (j is i or one of its ancestors)."""
    n = len(parents)
    mask = torch.eye(n, dtype=torch.bool)
    for i, parent in enumerate(parents):
        if parent >= 0:
            mask[i] |= mask[parent]
    return mask


def leaf_chain_len(parents: Sequence[int]) -> int:
    """How many leading nodes form a chain from the root (node i's parent is i - 1)."""
    for i, parent in enumerate(parents):
        if parent != i - 1:
            return i
    return len(parents)


class TreeNode(Protocol):
    """A candidate node of a tree being grown."""

    parent: int
    """Candidate index of the parent, -1 for the root."""
    token: int


class FedSlots:
    """Tree nodes a drafter fed into its cache after the committed entries, one slot each in
    feeding order, and which slots each one sees (its ancestors' and its own). Both drafters'
    tree growers keep one (``cascade.core.proposers.tree``)."""

    def __init__(self) -> None:
        self.slot_of: dict[int, int] = {}
        """Candidate index -> slot (after the committed ones) of each node fed so far."""
        self.seen: list[list[int]] = []
        """Per fed slot: the slots it attends to (its ancestors' and its own)."""

    def place(self, ids: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        """Slots for the nodes ``ids`` whose parents are ``parents`` (candidate indices, -1:
        the root); returns [len(ids), slots so far] bool: the slots each new node sees."""
        fed = len(self.seen)
        for node, parent in zip(ids, parents, strict=True):
            above = self.seen[self.slot_of[parent]] if parent >= 0 else []
            self.slot_of[node] = len(self.seen)
            self.seen.append(above + [len(self.seen)])
        visible = torch.zeros(len(ids), len(self.seen), dtype=torch.bool)
        for row, slots in enumerate(self.seen[fed:]):
            visible[row, slots] = True
        return visible

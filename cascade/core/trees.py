"""Token trees on the torch side: each node's children, its path and the attention mask among
nodes (the layout and its checks, torch-free, are ``cascade.protocol.trees``)."""

from __future__ import annotations

from collections.abc import Sequence

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

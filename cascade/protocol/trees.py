"""Token trees: several candidates per position in one block.

A block's nodes are listed parents first: node i carries a token and ``parents[i]``, the index
of its parent node, or -1 when its parent is the root (the last committed token). A chain is the
tree whose parents are -1, 0, 1, ...; ``parents=None`` on a ``Draft`` means exactly that, so
every chain-only block stays valid.

Node i of depth d (a root child has depth 1) stands at position ``base + d - 1`` of the sequence
(``base``: the committed length); the target's distribution after it predicts position
``base + d``. In a verifying pass each node attends to the committed prefix, its ancestors and
itself (``ancestor_mask``). The verdict names the accepted path: node indices from a root child
down (``TreeVerdict``).
"""

from __future__ import annotations

from collections.abc import Sequence

from cascade.protocol.limits import MAX_TREE_NODES


def chain_parents(count: int) -> list[int]:
    """The parents of a chain of ``count`` nodes."""
    return list(range(-1, count - 1))


def is_chain(parents: Sequence[int] | None) -> bool:
    return parents is None or all(p == i - 1 for i, p in enumerate(parents))


def misplaced_parent(parents: Sequence[int]) -> int | None:
    """The first node whose parent is not in [-1, own index) (a parent listed after its child,
    or out of range: not a tree in topological order), or None."""
    return next((i for i, parent in enumerate(parents) if not -1 <= parent < i), None)


def tree_problem(parents: Sequence[int], max_nodes: int = MAX_TREE_NODES,
                 max_depth: int | None = None) -> str | None:
    """What makes ``parents`` not a tree in topological order, or None. Checked: node count,
    each parent in [-1, own index) (so no cycles and parents first), and the depth."""
    if len(parents) > max_nodes:
        return f"{len(parents)} nodes; at most {max_nodes}"
    bad = misplaced_parent(parents)
    if bad is not None:
        return f"node {bad} names parent {parents[bad]}; a parent must be in [-1, {bad})"
    if max_depth is not None and parents and max(depths(parents)) > max_depth:
        return f"depth {max(depths(parents))}; at most {max_depth}"
    return None


def depths(parents: Sequence[int]) -> list[int]:
    """Depth of each node (a root child has depth 1)."""
    out: list[int] = []
    for parent in parents:
        out.append(1 if parent < 0 else out[parent] + 1)
    return out


def path_problem(path: Sequence[int], num_accepted: int) -> str | None:
    """What makes ``path`` not an accepted path through a tree (node indices from a root child
    down, so increasing, ``num_accepted`` of them, at most MAX_TREE_NODES), or None. Empty:
    a chain's outcome. Whether it runs through the block's own tree the verdict tells."""
    if not path:
        return None
    if len(path) > MAX_TREE_NODES or path[-1] >= MAX_TREE_NODES:
        return f"at most {MAX_TREE_NODES} node indices, each below {MAX_TREE_NODES}"
    if any(b <= a for a, b in zip(path, path[1:])):
        return "node indices must increase (a parent is listed before its children)"
    if len(path) != num_accepted:
        return f"{len(path)} nodes for num_accepted {num_accepted}; they must be equal"
    return None

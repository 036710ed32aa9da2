"""A token tree from the drafter model, one forward pass per depth (EAGLE-2's dynamic trees).

At each depth every frontier node offers its ``branching`` best children (the root up to four
times as many), scored by the drafter's cumulative log-probability along the path (a child never
outscores its parent); the next frontier is the ``branching`` best of them. Only frontier nodes
are fed: all of one depth in one pass on the drafter's own cache, each attending to the
committed tokens, its ancestors and itself, at position committed length + depth - 1. At the
end the ``nodes`` best candidates are the tree (ancestor-closed: parents score at least as well
and were made first), listed best first (so parents first); the cache holds the committed
tokens again, the fed nodes kept aside by path for the next round (``SequenceCache.keep_grown``).

The builders do not care which drafter feeds the nodes: a ``TreeGrower`` does, the model
drafter's (``cascade.core.model.tree_grower``: a 4D additive mask on its ``DynamicCache``) or
the one a cache brings itself (``tree_grower``: the feature drafter's,
``cascade.core.features.feature_tree``).

``rank`` turns a frontier's logits into the log-scores of its children: the drafter's log-softmax
(greedy), or for position-keyed sampling the log-softmax of log q + the position's noise, so the
first child is the drafter's keyed choice (the target's own, when the two models agree).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple, Protocol

import torch

from cascade.core.model.runner import SequenceCache
from cascade.core.model.tree_grower import ModelTreeGrower
from cascade.core.trees import TreeNode

if TYPE_CHECKING:
    from cascade.core.features.feature_runner import FeatureCache

    DrafterCache = SequenceCache | FeatureCache

ROOT_WIDTH_FACTOR = 4

Rank = Callable[[torch.Tensor, int], torch.Tensor]
"""(logits [F, vocab], the children's position) -> log-scores [F, vocab]."""


class TreeShape(NamedTuple):
    nodes: int
    """Most nodes in the tree."""
    depth: int
    """Most nodes on a path (the block length a chain would have)."""
    branching: int
    """Children offered per frontier node, and frontier nodes kept per depth."""
    root_branching: int = 0
    """Children the root offers; 0: wider than the rest (the drafter's first token is the one
    most often wrong, and a miss there loses the whole block), ``ROOT_WIDTH_FACTOR`` x
    branching, at most ``nodes``."""

    @property
    def root_width(self) -> int:
        if self.root_branching:
            return self.root_branching
        return max(self.branching, min(self.nodes, ROOT_WIDTH_FACTOR * self.branching))


class _Candidate(NamedTuple):
    score: float
    parent: int
    """Candidate index of the parent, -1 for the root."""
    token: int


class TreeGrower(Protocol):
    """Feeds tree nodes into one sequence's drafter cache after its committed tokens, one
    depth's frontier per pass; on exit (a context manager) the cache holds the committed
    tokens again."""

    def __enter__(self) -> TreeGrower: ...

    def __exit__(self, *exc) -> None: ...

    def feed(self, nodes: list[TreeNode], ids: list[int], depth: int) -> torch.Tensor:
        """One pass over one depth's ``nodes`` (candidate indices ``ids``, parents fed before
        them); returns their logits [F, vocab]."""


def _grower(cache: DrafterCache, base: int) -> TreeGrower:
    """The grower of the cache's own kind (``tree_grower``) where it has one, else the model
    drafter's."""
    own = getattr(cache, "tree_grower", None)
    return own(base) if own is not None else ModelTreeGrower(cache, base)


def log_softmax_rank(logits: torch.Tensor, position: int) -> torch.Tensor:
    return torch.log_softmax(logits.float(), dim=-1)


@torch.inference_mode()
def draft_tree(cache: DrafterCache, committed: list[int], shape: TreeShape,
               rank: Rank = log_softmax_rank) -> tuple[list[int], list[int]]:
    """(tokens, parents) of a tree after ``committed`` (parents: -1 for a root child)."""
    base = len(committed)
    logits = cache.forward_to(committed).logits[-1:]  # [1, vocab]
    candidates: list[_Candidate] = []
    frontier, frontier_scores = [-1], torch.zeros(1, dtype=torch.float64)
    with _grower(cache, base) as grower:
        for depth in range(1, shape.depth + 1):
            scores = rank(logits, base + depth - 1).double().clamp_max(0.0)  # [F, vocab]
            width = min(shape.root_width if depth == 1 else shape.branching, scores.shape[-1])
            top = (frontier_scores[:, None] + scores).topk(width, dim=-1)
            first = len(candidates)
            for f, parent in enumerate(frontier):
                candidates += [_Candidate(float(s), parent, int(t))
                               for s, t in zip(top.values[f], top.indices[f])]
            new = torch.tensor([c.score for c in candidates[first:]], dtype=torch.float64)
            keep = new.topk(min(shape.branching, len(new))).indices.sort().values
            frontier = [first + int(i) for i in keep]
            frontier_scores = new[keep]
            if depth < shape.depth:
                logits = grower.feed([candidates[i] for i in frontier], frontier, depth)
    return _select(candidates, shape.nodes)


CONFIDENCE_WIDTHS = ((0.3, 8), (0.6, 6), (0.8, 4), (1.0, 2))
"""CAPE's schedule: (the drafter's top probability up to, candidates offered at the position),
the chain's own token included."""


def confidence_width(confidence: float) -> int:
    """Candidates a position offers when the drafter's best token has this probability."""
    return next(width for bound, width in CONFIDENCE_WIDTHS if confidence <= bound)


@torch.inference_mode()
def draft_confident_tree(cache: DrafterCache, committed: list[int], shape: TreeShape,
                         rank: Rank = log_softmax_rank) -> tuple[list[int], list[int]]:
    """CAPE's confidence-aware expansion: the drafter's own chain (one pass per depth, one
    token each, as a chain is drafted) and at each position the runners-up its confidence asks
    for (``confidence_width``), as siblings of that position's chain token. The siblings are
    leaves and never fed, so the tree costs the drafter what the chain costs; the ``nodes``
    best by cumulative log-probability are kept, best first. ``shape.branching`` is not used:
    the width comes from the drafter's confidence."""
    base = len(committed)
    logits = cache.forward_to(committed).logits[-1:]  # [1, vocab]
    candidates: list[_Candidate] = []
    parent, score = -1, 0.0
    with _grower(cache, base) as grower:
        for depth in range(1, shape.depth + 1):
            scores = rank(logits, base + depth - 1).double().clamp_max(0.0)[0]  # [vocab]
            width = min(confidence_width(float(scores.max().exp())), shape.nodes, len(scores))
            top = scores.topk(width)
            chain = len(candidates)
            candidates += [_Candidate(score + float(s), parent, int(t))
                           for s, t in zip(top.values, top.indices)]
            parent, score = chain, candidates[chain].score
            if depth < shape.depth:
                logits = grower.feed([candidates[chain]], [chain], depth)
    return _select(candidates, shape.nodes)


Sampler = Callable[[torch.Tensor, int, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
"""(logits [F, vocab], the children's position, count) -> (children [F, count], -1 past the
last; the support ids of each row's q [F, K]; the q each child was drawn from [F, count, K],
the first being the row's q itself)."""


@torch.inference_mode()
def draft_sampled_tree(cache: DrafterCache, committed: list[int], shape: TreeShape,
                       sample: Sampler) -> tuple[list[int], list[int], torch.Tensor, torch.Tensor]:
    """A tree for the recursive rule: every expanded node gets all its children sampled from
    its q (``branching`` of them, without replacement: each carries the q it was drawn from,
    the node's q without its earlier siblings; none pruned); each depth
    expands the likeliest distinct children (at most ``branching``) while the node budget
    lasts. Returns (tokens, parents, q ids [n, K], q probs [n, K]), each node's q
    being the one it was sampled from."""
    base = len(committed)
    logits = cache.forward_to(committed).logits[-1:]  # [1, vocab]
    nodes: list[_Candidate] = []
    q_ids, q_probs = [], []
    frontier, frontier_scores = [-1], [0.0]
    with _grower(cache, base) as grower:
        for depth in range(1, shape.depth + 1):
            count = min(shape.branching, shape.nodes)
            ids, support, probs = sample(logits, base + depth - 1, count)
            first = len(nodes)
            for f, parent in enumerate(frontier):
                chance = dict(zip(support[f].tolist(), probs[f, 0].tolist()))
                for j, token in enumerate(ids[f].tolist()):
                    if token < 0:
                        break
                    score = frontier_scores[f] + math.log(max(chance[token], 1e-30))
                    nodes.append(_Candidate(score, parent, token))
                    q_ids.append(support[f])
                    q_probs.append(probs[f, j])
            room = (shape.nodes - len(nodes)) // shape.branching
            if depth == shape.depth or room < 1:
                break
            frontier = _likeliest_distinct(nodes, first, min(shape.branching, room))
            frontier_scores = [nodes[i].score for i in frontier]
            logits = grower.feed([nodes[i] for i in frontier], frontier, depth)
    return ([n.token for n in nodes], [n.parent for n in nodes], torch.stack(q_ids),
            torch.stack(q_probs))


def _likeliest_distinct(nodes: list[_Candidate], first: int, count: int) -> list[int]:
    """Indices of the ``count`` best-scoring nodes from ``first`` on, one per (parent, token)."""
    seen, chosen = set(), []
    for i in sorted(range(first, len(nodes)), key=lambda i: (-nodes[i].score, i)):
        key = (nodes[i].parent, nodes[i].token)
        if key not in seen:
            seen.add(key)
            chosen.append(i)
        if len(chosen) == count:
            break
    return sorted(chosen)


def _select(candidates: list[_Candidate], count: int) -> tuple[list[int], list[int]]:
    """The ``count`` best candidates, best first, parents renumbered. Best first is also
    parents first (a parent scores at least as well as its child and was made before it), so
    every prefix of the tree is a tree of the best nodes: what a verifier that takes only part
    of a block keeps."""
    kept = sorted(range(len(candidates)), key=lambda i: (-candidates[i].score, i))[:count]
    index = {c: n for n, c in enumerate(kept)}
    tokens = [candidates[c].token for c in kept]
    parents = [-1 if candidates[c].parent < 0 else index[candidates[c].parent] for c in kept]
    return tokens, parents

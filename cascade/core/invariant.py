"""Batch-invariant passes: the numbers computed for a position do not depend on the pass.

A verify pass over k + 1 tokens, a one-token decode step and a prefill of the same positions
must give bit-identical logits, whatever else shares the pass (other sessions' rows, their
draft lengths, tree nodes, their cached lengths). Two things in a plain pass break that:

- **Matrix products choose their kernel by row count.** On the CPU, MKL's float32 GEMM takes a
  different path for a 1..3-row tail than for a full 4-row tile (and for 1..3 rows a different
  one again); oneDNN's bfloat16 GEMM takes a vector path for one row. Within one path each row
  is computed alone. The fix (``row_multiple``): every product in the pass gets a row count that
  is a multiple of a block size measured for the model on this machine (filler rows are added
  and dropped), so every row goes through the same kernel whatever the count.
- **Attention takes a different path for one query than for several** (SDPA: no mask vs a
  mask, key splits sized by the key count), and a product that reduces over the keys blocks its
  reduction by the total key count, so zero weights past a query's position still change the
  rounding. The fix (``attend``): a query at position ``p`` always attends over the same key
  span, ``[first, end)`` with ``end = p + 1`` rounded up to ``KEY_BLOCK`` (and ``first`` the
  window's start rounded down), positions past ``p`` masked, computed in float32 by one fixed
  sequence of operations. Queries are grouped by span; a tree node gathers its own keys (the
  slots before the tree, then its ancestors and itself) so it sees exactly the sequence the
  accepted path would have in one-token decoding.

Per-token operations (norms, rotary embeddings, activations) reduce within a row only and are
invariant as they are. What remains machine-dependent is checked, not assumed: ``row_multiple``
probes the model's own matrix shapes at start-up and says when no block size makes them
invariant (a GPU's split-K GEMMs, for instance), and the engine then reports the mode as
unverified.
"""

from __future__ import annotations

import logging
from collections import defaultdict

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

KEY_BLOCK = 64
"""Key spans end on a multiple of this many positions (the masked keys a decode step pays)."""
ROW_BLOCKS = (1, 2, 4, 8, 16, 32)
"""Candidate row multiples, smallest first."""
_PROBE_COUNTS = (1, 2, 3, 5, 8, 13)
"""Row counts probed, in units of the candidate multiple."""


def padded(count: int, multiple: int) -> int:
    return -(-count // multiple) * multiple


def key_span(position: int, window: int | None) -> tuple[int, int]:
    """The keys ``[first, end)`` a query at ``position`` attends over, a function of the position
    alone."""
    end = padded(position + 1, KEY_BLOCK)
    if window is None:
        return 0, end
    return max(0, position - window + 1) // KEY_BLOCK * KEY_BLOCK, end


def canonical_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                        visible: torch.Tensor, scaling: float, softcap: float | None,
                        multiple: int) -> torch.Tensor:
    """query [B, heads, c, d], keys/values [B, kv_heads, S, d], visible [B, c, S] bool ->
    [B, heads, c, d] in the query's dtype. Rows are padded to ``multiple`` (copies of the last
    query), so each product sees a row count its kernel computes row by row alike."""
    batch, heads, count, dim = query.shape
    kv_heads, groups = keys.shape[1], heads // keys.shape[1]
    fill = padded(count, multiple) - count
    if fill:
        query = torch.cat([query, query[:, :, -1:].expand(-1, -1, fill, -1)], dim=2)
        visible = torch.cat([visible, visible[:, -1:].expand(-1, fill, -1)], dim=1)
    rows = count + fill
    q = query.float().reshape(batch, kv_heads, groups * rows, dim)
    scores = torch.matmul(q, keys.float().transpose(-1, -2)) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    mask = visible[:, None, None].expand(-1, 1, groups, -1, -1).reshape(batch, 1, groups * rows,
                                                                      -1)
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    out = torch.matmul(weights, values.float()).reshape(batch, heads, rows, dim)
    return out[:, :, :count].to(query.dtype)


def attend(keys: torch.Tensor, values: torch.Tensor, query: torch.Tensor, feed,
           scaling: float, window: int | None, softcap: float | None,
           multiple: int) -> torch.Tensor:
    """One row's attention. keys/values: [kv_heads, region size, d] (the row's region of one
    layer); query [1, heads, count, d] -> [1, heads, count, d]."""
    positions = feed.positions().tolist()
    out = torch.empty_like(query)
    chain = feed.tree_start - feed.start
    spans: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, position in enumerate(positions[:chain]):
        spans[key_span(position, window)].append(i)
    for (first, end), index in spans.items():
        rows = torch.tensor(index)
        key_positions = torch.arange(first, end)
        query_positions = torch.tensor([positions[i] for i in index])
        visible = _visible(key_positions[None], query_positions, window)
        out[:, :, rows] = canonical_attention(
            query[:, :, rows], keys[None, :, first:end], values[None, :, first:end],
            visible[None], scaling, softcap, multiple)
    if feed.parents:
        _attend_tree(keys, values, query, feed, positions[chain:], out, chain, scaling,
                     window, softcap, multiple)
    return out


def _attend_tree(keys, values, query, feed, positions, out, chain, scaling, window, softcap,
                 multiple) -> None:
    """Tree nodes: each gathers, in position order, the slots before the tree and then its
    ancestors and itself, so it attends over exactly what one-token decoding of that path
    would hold."""
    tree_start, parents = feed.tree_start, feed.parents
    by_span: dict[tuple[int, int], list[int]] = defaultdict(list)
    for node, position in enumerate(positions):
        by_span[key_span(position, window)].append(node)
    for (first, end), nodes in by_span.items():
        slots = torch.stack([_node_slots(node, parents, tree_start, first, end)
                             for node in nodes])  # [n, S]
        node_keys = keys[:, slots].transpose(0, 1)  # [n, kv_heads, S, d]
        node_values = values[:, slots].transpose(0, 1)
        query_positions = torch.tensor([positions[node] for node in nodes])
        visible = _visible(torch.arange(first, end)[None], query_positions, window)[:, None]
        rows = torch.tensor([chain + node for node in nodes])
        node_query = query[0, :, rows].transpose(0, 1)[:, :, None]  # [n, heads, 1, d]
        result = canonical_attention(node_query, node_keys, node_values, visible, scaling,
                                     softcap, multiple)
        out[0, :, rows] = result[:, :, 0].transpose(0, 1)


def _node_slots(node: int, parents: tuple[int, ...], tree_start: int, first: int,
                end: int) -> torch.Tensor:
    """[end - first] the region slots holding positions first .. end - 1 of the node's path
    (slot 0 past the node: masked, any finite entry does)."""
    path = []
    while node >= 0:
        path.append(tree_start + node)
        node = parents[node]
    sequence = list(range(tree_start)) + path[::-1]
    sequence += [0] * (end - len(sequence))
    return torch.tensor(sequence[first:end])


def _visible(key_positions: torch.Tensor, query_positions: torch.Tensor,
             window: int | None) -> torch.Tensor:
    """[queries, keys] causal (and within the window) by position."""
    visible = key_positions <= query_positions[:, None]
    if window is not None:
        visible &= key_positions > query_positions[:, None] - window
    return visible


@torch.inference_mode()
def row_multiple(model, seed: int = 0) -> int | None:
    """The smallest row multiple that makes every matrix product of ``model``'s pass give each
    row the same numbers whatever the row count, probed on this machine with the model's own
    weight shapes (and the attention products); None when no candidate does."""
    generator = torch.Generator().manual_seed(seed)
    weights = _distinct_weights(model)
    for multiple in ROW_BLOCKS:
        if all(_rows_invariant(lambda x, w=w: F.linear(x, w), w.shape[1], w.dtype, multiple,
                               generator) for w in weights) and _attention_invariant(
                model, multiple, generator):
            return multiple
    log.warning("no row multiple in %s makes this model's matrix products row-invariant on "
                "this machine: batch-invariant mode is unverified", ROW_BLOCKS)
    return None


def _distinct_weights(model) -> list[torch.Tensor]:
    seen, weights = set(), []
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if isinstance(module, torch.nn.Linear) and weight is not None:
            key = (tuple(weight.shape), weight.dtype)
            if key not in seen:
                seen.add(key)
                weights.append(weight)
    return weights


def _rows_invariant(product, width: int, dtype: torch.dtype, multiple: int,
                    generator: torch.Generator) -> bool:
    """Whether ``product`` gives the first and last ``multiple`` rows of every probed row count
    the numbers a call with only those rows gives."""
    largest = multiple * max(_PROBE_COUNTS)
    x = torch.randn(largest, width, generator=generator).to(dtype)
    head = product(x[:multiple])
    for count in _PROBE_COUNTS:
        rows = count * multiple
        out = product(x[:rows])
        tail = product(x[rows - multiple : rows])
        if not (torch.equal(out[:multiple], head) and torch.equal(out[-multiple:], tail)):
            return False
    return True


def _attention_invariant(model, multiple: int, generator: torch.Generator) -> bool:
    """The two attention products, in float32, for a few key spans."""
    config = model.config
    heads = config.num_attention_heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    for span in (KEY_BLOCK, 4 * KEY_BLOCK):
        keys = torch.randn(span, dim, generator=generator)
        if not (_rows_invariant(lambda x, k=keys: x @ k.T, dim, torch.float32, multiple,
                                generator)
                and _rows_invariant(lambda x, k=keys: x @ k, span, torch.float32, multiple,
                                    generator)):
            return False
    return True


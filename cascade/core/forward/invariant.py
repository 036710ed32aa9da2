"""Batch-invariant passes: the numbers computed for a position do not depend on the pass.

A verify pass over k + 1 tokens, a one-token decode step and a prefill of the same positions
must give bit-identical logits, whatever else shares the pass (other sessions' rows, their
draft lengths, tree nodes, their cached lengths). Two things in a plain pass break that:

- **Matrix products choose their kernel by row count.** On the CPU, MKL's float32 GEMM takes a
  different path for a 1..3-row tail than for full 4-row tiles (below about 12 rows), and
  oneDNN's bfloat16 GEMM a vector path for one row. Within one path each row is computed
  alone. The fix (``RowRule``): every product gets a row count its kernel treats alike, a
  multiple and a minimum probed for the model on this machine (``probe``); filler rows are
  added and dropped.
- **Attention takes a different path for one query than for several** (SDPA: no mask vs a
  mask, key splits sized by the key count), and a product that reduces over the keys blocks
  its reduction by the total key count, so even zero weights past a query's position change
  the rounding. The fix (``attend``): a query at position ``p`` always attends over the same
  key span, ``[first, end)`` with ``end = p + 1`` rounded up to ``KEY_BLOCK`` (and ``first``
  the window's start rounded down), positions past ``p`` masked, in float32, by one fixed
  sequence of operations (``canonical_attention``). Queries are grouped by span, groups of
  one span and padded size are batched across rows (``plan``), and a tree node gathers its
  own keys (the slots before the tree, then its ancestors and itself): it sees exactly the
  sequence one-token decoding of its path would hold. On a CPU with the fixed-order kernels
  (``cascade.core.forward.fixed_order``) the groups go to its attention instead, each query
  over its own visible keys in slot order (``AttentionPlan``; spans and padding then change
  nothing by construction); the buckets serve other devices.

Per-token operations (norms, rotary embeddings, activations) reduce within a row only and are
invariant as they are. What remains machine-dependent is checked, not assumed: ``probe``
(``cascade.core.forward.row_rules``) tries
the model's own weight shapes and the attention products at start-up and says when no rule
makes them invariant (a GPU's split-K GEMMs, for instance); the engine then reports the pass
as unverified.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace

import torch

from cascade.core.forward import fixed_order
from cascade.core.forward.row_rules import RowRule, padded

KEY_BLOCK = 64
"""Key spans end on a multiple of this many positions (the masked keys a decode step pays)."""


def key_span(position: int, window: int | None) -> tuple[int, int]:
    """The keys ``[first, end)`` a query at ``position`` attends over, a function of the position
    alone."""
    end = padded(position + 1, KEY_BLOCK)
    if window is None:
        return 0, end
    return max(0, position - window + 1) // KEY_BLOCK * KEY_BLOCK, end


@dataclass(frozen=True)
class Group:
    """Queries that attend over one sequence of key slots: a chain row's queries with one span,
    or one tree node (its own path)."""

    rows: list[int]
    """Packed query rows."""
    slots: list[int]
    """Store slots holding positions ``first .. first + len(slots) - 1``, in position order."""
    visible: torch.Tensor
    """[len(rows), len(slots)] bool."""


@dataclass(frozen=True)
class Bucket:
    """Groups with the same span and padded query count, computed by one batched product."""

    batch: int
    span: int
    padded_rows: int
    slots: torch.Tensor
    """[batch * span] store slots."""
    queries: torch.Tensor
    """[batch * padded_rows] packed query rows (the last repeated as padding)."""
    real: torch.Tensor
    """Indices into the batch * padded_rows results that are real queries ..."""
    rows: torch.Tensor
    """... and the packed rows they answer."""
    hidden: torch.Tensor
    """[1, batch, groups * padded_rows, span] bool: True where a query must not look."""
    first_slot: int | None
    """The first slot when the bucket is one contiguous run of slots (a view, no gather)."""

    def to(self, device: torch.device) -> Bucket:
        """The bucket with its index and mask tensors on ``device`` (the store's)."""
        return replace(self, slots=self.slots.to(device), queries=self.queries.to(device),
                       real=self.real.to(device), rows=self.rows.to(device),
                       hidden=self.hidden.to(device))


def plan(feeds, window: int | None, groups: int, rule: RowRule, pad_limit: int = 0,
         device: torch.device | str = "cpu") -> fixed_order.AttentionPlan | list[Bucket]:
    """The step's attention for one kind of layer, built once and used by every such layer
    (its tensors on ``device``, the store's)."""
    members, offset = [], 0
    for feed in feeds:
        members += _groups(feed, offset, window)
        offset += len(feed.tokens)
    return planned(members, groups, rule, pad_limit, device)


def planned(members: list[Group], groups: int, rule: RowRule, pad_limit: int,
            device: torch.device | str) -> fixed_order.AttentionPlan | list[Bucket]:
    """The groups as the fixed-order kernel's plan on the CPU where it is built, else as
    buckets of the canonical attention's batched products."""
    if torch.device(device).type == "cpu" and fixed_order.available():
        return fixed_order.AttentionPlan.of(members)
    return [b.to(device) for b in buckets(members, groups, rule, pad_limit)]


SPAN_WASTE = 2.0
"""Groups of different spans share a padded product while its keys stay within this factor of
their own (one long row gets a product of its own rather than making short ones pay for it)."""


def buckets(members: list[Group], groups: int, rule: RowRule, pad_limit: int = 0
            ) -> list[Bucket]:
    """Groups batched into products: by span and padded query count; groups of spans up to
    ``pad_limit`` (``span_pad_limit``: padding them with masked key blocks up to it changes
    nothing) share products whatever their spans and query counts, each padded to its longest
    span (within ``SPAN_WASTE``) and its largest padded query count (a count the rule gives
    too)."""
    by_key: dict[tuple[int, int], list[Group]] = defaultdict(list)
    short = []
    for group in members:
        if len(group.slots) <= pad_limit:
            short.append(group)
        else:
            by_key[len(group.slots), rule.pad(len(group.rows))].append(group)
    out = [_bucket(span, rows, chosen, groups) for (span, rows), chosen in by_key.items()]
    return out + [_merged([short[i] for i in chosen], groups, rule)
                  for chosen in span_groups([len(g.slots) for g in short])]


def span_groups(spans: list[int]) -> list[list[int]]:
    """Indices of ``spans`` grouped for products padded to their longest: in order of span, a
    new group begun where padding every member to the longest would pass ``SPAN_WASTE`` times
    their own total (the invariant attention's buckets, the plain pass's batches of rows)."""
    out: list[list[int]] = []
    chosen, total = [], 0
    for i in sorted(range(len(spans)), key=spans.__getitem__):
        if chosen and spans[i] * (len(chosen) + 1) > SPAN_WASTE * (total + spans[i]):
            out.append(chosen)
            chosen, total = [], 0
        chosen.append(i)
        total += spans[i]
    return out + ([chosen] if chosen else [])


def _merged(members: list[Group], groups: int, rule: RowRule) -> Bucket:
    span = max(len(g.slots) for g in members)
    rows = max(rule.pad(len(g.rows)) for g in members)
    return _bucket(span, rows, [_padded_span(g, span) for g in members], groups)


def _padded_span(group: Group, span: int) -> Group:
    """``group`` over ``span`` key slots: the added ones (its first slot again) masked."""
    extra = span - len(group.slots)
    if not extra:
        return group
    return Group(group.rows, group.slots + group.slots[:1] * extra,
                 torch.cat([group.visible, group.visible.new_zeros(len(group.rows), extra)], 1))


def _groups(feed, offset: int, window: int | None) -> list[Group]:
    positions = feed.positions().tolist()
    chain = feed.tree_start - feed.start
    spans: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, position in enumerate(positions[:chain]):
        spans[key_span(position, window)].append(i)
    table = feed.table
    out = [Group([offset + i for i in index], table.slots(first, end),
                 visible(torch.arange(first, end), [positions[i] for i in index], window))
           for (first, end), index in spans.items()]
    for node, position in enumerate(positions[chain:]):
        first, end = key_span(position, window)
        slots = [table.slot(slot) for slot in _node_slots(node, feed.parents, feed.tree_start)]
        slots += [table.slot(0)] * (end - len(slots))  # past the node: masked, finite entries
        out.append(Group([offset + chain + node], slots[first:end],
                         visible(torch.arange(first, end), [position], window)))
    return out


def _bucket(span: int, rows: int, members: list[Group], groups: int) -> Bucket:
    queries, real, out_rows, masks = [], [], [], []
    for b, group in enumerate(members):
        fill = rows - len(group.rows)
        queries += group.rows + group.rows[-1:] * fill
        real += range(b * rows, b * rows + len(group.rows))
        out_rows += group.rows
        visible = torch.cat([group.visible, group.visible[-1:].expand(fill, -1)])
        masks.append(visible.repeat(groups, 1))  # query heads of a kv head: (head, row) rows
    slots = [s for g in members for s in g.slots]
    contiguous = len(members) == 1 and slots == list(range(slots[0], slots[0] + span))
    return Bucket(len(members), span, rows, torch.tensor(slots), torch.tensor(queries),
                  torch.tensor(real), torch.tensor(out_rows), ~torch.stack(masks)[None],
                  slots[0] if contiguous else None)


def attend(plan: fixed_order.AttentionPlan | list[Bucket], keys: torch.Tensor, values: torch.Tensor,
           query: torch.Tensor, scaling: float, softcap: float | None) -> torch.Tensor:
    """keys/values: [kv_heads, capacity, d] (one layer of the store); query [1, heads, N, d]
    -> [1, heads, N, d] (rows the plan does not answer, the filler rows, are zero)."""
    if isinstance(plan, fixed_order.AttentionPlan):
        out = fixed_order.attention(query[0].float().contiguous(), keys, values, plan,
                                    scaling, softcap)
        return out.to(query.dtype)[None]
    buckets = plan
    heads, count, dim = query.shape[1], query.shape[2], query.shape[-1]
    kv_heads = keys.shape[0]
    groups = heads // kv_heads
    out = query.new_empty(heads, count, dim)
    if count > sum(len(b.rows) for b in buckets):
        out.zero_()  # the filler rows
    for b in buckets:
        k, v = (_gather(keys, b).view(kv_heads, b.batch, b.span, dim),
                _gather(values, b).view(kv_heads, b.batch, b.span, dim))
        q = query[0].index_select(1, b.queries).view(kv_heads, groups, b.batch, b.padded_rows,
                                                     dim)
        q = q.transpose(1, 2).reshape(kv_heads, b.batch, groups * b.padded_rows, dim)
        result = canonical_attention(q, k, v, b.hidden, scaling, softcap)
        result = result.view(kv_heads, b.batch, groups, b.padded_rows, dim).transpose(1, 2)
        out.index_copy_(1, b.rows, result.reshape(heads, -1, dim).index_select(1, b.real)
                        .to(out.dtype))
    return out[None]


def _gather(store: torch.Tensor, bucket: Bucket) -> torch.Tensor:
    if bucket.first_slot is not None:
        return store.narrow(1, bucket.first_slot, bucket.span)
    return store.index_select(1, bucket.slots)


def canonical_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                        hidden: torch.Tensor, scaling: float, softcap: float | None
                        ) -> torch.Tensor:
    """The one sequence of operations every query goes through, in float32: query
    [kv_heads, B, rows, d], keys/values [kv_heads, B, S, d], hidden [1, B, rows, S] ->
    [kv_heads, B, rows, d]."""
    scores = torch.matmul(query.float(), keys.float().transpose(-1, -2)).mul_(scaling)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    weights = torch.softmax(scores.masked_fill_(hidden, float("-inf")), dim=-1)
    return torch.matmul(weights, values.float())


def _node_slots(node: int, parents: tuple[int, ...], tree_start: int) -> list[int]:
    """Region slots of positions 0 .. of the node's path: before the tree, then its
    ancestors and itself."""
    path = []
    while node >= 0:
        path.append(tree_start + node)
        node = parents[node]
    return list(range(tree_start)) + path[::-1]


def visible(key_positions: torch.Tensor, query_positions: list[int],
             window: int | None) -> torch.Tensor:
    """[queries, keys] causal (and within the window) by position."""
    queries = torch.tensor(query_positions)[:, None]
    visible = key_positions[None] <= queries
    if window is not None:
        visible &= key_positions[None] > queries - window
    return visible

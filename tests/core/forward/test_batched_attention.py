"""The packed pass's attention, batched: one SDPA call for rows of different cached lengths,
chains, token trees and prefill chunks gives every row the logits the model gives that row's
sequence alone (plain mode: within float tolerance), for every attention family; and the rows
are grouped into batches by their key spans."""

import pytest
import torch

from cascade.core.forward.invariant import SPAN_WASTE, Group, buckets
from cascade.core.kv.kv_store import KVShape, KVStore
from cascade.core.forward.row_rules import RowRule
from cascade.core.forward.packed import Feed, packed_forward
from cascade.core.forward.packed_backend import enable
from cascade.core.forward.row_batches import batched_rows
from cascade.core.trees import ancestor_mask
from models import (full_forward, tiny_gemma2, tiny_gpt2, tiny_llama, tiny_mistral,
                    tiny_qwen2_sliding)

FAMILIES = {"llama": tiny_llama, "gpt2": tiny_gpt2, "mistral": tiny_mistral,
            "qwen2-sliding": tiny_qwen2_sliding, "gemma2": tiny_gemma2}
TREE = (-1, -1, 0, 0, 1, 2)
ROWS = [  # (cached context, new tokens, tree parents of the last new tokens)
    (list(range(3, 40)), [7], None),
    (list(range(5, 12)), [9, 4, 8, 2, 6], None),
    ([], list(range(20, 33)), None),  # a prefill
    (list(range(9, 30)), [11, 3, 5, 13, 17, 19, 23], TREE),  # a root, then a 6-node tree
    (list(range(2, 5)), [1], None),
]


def _paths(context: list[int], tokens: list[int], parents) -> list[list[int]]:
    """The sequence each fed token ends: a chain's prefixes, a tree node's path."""
    if parents is None:
        return [context + tokens[: i + 1] for i in range(len(tokens))]
    chain = tokens[: len(tokens) - len(parents)]
    nodes = tokens[len(chain):]
    seen = ancestor_mask(parents)
    out = [context + chain[: i + 1] for i in range(len(chain))]
    return out + [context + chain + [nodes[j] for j in range(len(nodes)) if seen[i, j]]
                  for i in range(len(nodes))]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_one_batched_pass_gives_each_row_its_own_sequences_logits(family):
    runner = FAMILIES[family](0)
    model = runner.model
    enable(model)
    store = KVStore(KVShape.of(model), 1024, model.device)
    regions = [store.new_table(128) for _ in ROWS]
    prefill = [Feed(r, 0, context) for r, (context, _, _) in zip(regions, ROWS) if context]
    packed_forward(model, store, prefill, torch.tensor([0]))
    feeds = [Feed(r, len(context), tokens, parents)
             for r, (context, tokens, parents) in zip(regions, ROWS)]
    count = sum(len(f.tokens) for f in feeds)
    logits, _ = packed_forward(model, store, feeds, torch.arange(count))
    expected = []
    with torch.inference_mode():
        for context, tokens, parents in ROWS:
            for path in _paths(context, tokens, parents):
                expected.append(full_forward(model, path).logits[0, -1].float())
    torch.testing.assert_close(logits, torch.stack(expected), atol=2e-4, rtol=2e-4)


def _feeds(lengths: list[int]) -> list[Feed]:
    store = KVStore(KVShape(1, 1, 4, torch.float32), 4096)
    return [Feed(store.new_table(length + 1), length, [1]) for length in lengths]


def test_rows_of_similar_spans_share_one_batch():
    batches = batched_rows(_feeds([100, 130, 90, 120]), None, torch.device("cpu"))
    assert len(batches) == 1
    assert batches[0].rows == 4 and batches[0].span == 131


def test_one_long_row_is_batched_apart_from_short_ones():
    feeds = _feeds([10, 12, 2000, 11])
    batches = batched_rows(feeds, None, torch.device("cpu"))
    assert [(b.rows, b.span) for b in batches] == [(3, 13), (1, 2001)]
    assert batches[1].first_slot == feeds[2].table.slot(0)  # its blocks are one run
    assert 3 * 13 <= SPAN_WASTE * (11 + 12 + 13)


def test_a_row_alone_reads_its_keys_as_a_view_of_the_store():
    (batch,) = batched_rows(_feeds([50]), None, torch.device("cpu"))
    assert batch.first_slot == 0 and batch.mask is None


def _group(span: int, rows: int) -> Group:
    return Group(list(range(rows)), list(range(span)), torch.ones(rows, span, dtype=torch.bool))


def test_invariant_groups_of_short_spans_share_one_product_padded_to_the_longest():
    members = [_group(64, 1), _group(128, 1), _group(192, 5), _group(640, 1), _group(640, 1)]
    merged = buckets(members, 2, RowRule(1, 1), pad_limit=384)
    assert sorted((b.batch, b.span, b.padded_rows) for b in merged) == [(2, 640, 1),
                                                                       (3, 192, 5)]
    short = next(b for b in merged if b.span == 192)
    assert short.hidden[0, 0, 0, 64:].all() and not short.hidden[0, 0, 0, :64].any()
    assert len(buckets(members, 2, RowRule(1, 1), pad_limit=0)) == 4  # by span and rows


def test_a_span_far_longer_than_the_rest_gets_a_product_of_its_own():
    merged = buckets([_group(64, 1), _group(64, 1), _group(384, 1)], 1, RowRule(1, 1), 384)
    assert sorted((b.batch, b.span) for b in merged) == [(1, 384), (2, 64)]

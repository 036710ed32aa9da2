"""The drafter's cache after a token tree: the accepted path's entries are moved into place
instead of fed again, the rest are dropped, and in the invariant mode a tree node's entries and
logits are bit-equal to feeding its path as a chain."""

import pytest
import torch

from cascade.core.forward import fixed_order
from cascade.core.forward.invariant import KEY_BLOCK
from cascade.core.model.tree_grower import ModelTreeGrower
from cascade.core.proposers.tree import TreeShape, _Candidate, draft_tree
from cascade.core.trees import path_to
from models import tiny_gemma2, tiny_gpt2, tiny_llama

AVX2_GAP = pytest.mark.xfail(
    torch.backends.cpu.get_cpu_capability() == "AVX2" and not fixed_order.available(),
    strict=False,
    reason="known gap: on an AVX2-only CPU without the fixed-order kernels a drafter cache's "
    "invariant tree pass differs from its paths fed as chains by ~1e-6 (the batched attention "
    "products; the kernels' attention closes it); drafts may differ, output cannot")

PREFIX = torch.randint(3, 90, (KEY_BLOCK + 5,), generator=torch.Generator().manual_seed(3)).tolist()
NODES = [_Candidate(0.0, -1, 11), _Candidate(0.0, -1, 23), _Candidate(0.0, 0, 7),
         _Candidate(0.0, 1, 30), _Candidate(0.0, 0, 2), _Candidate(0.0, 4, 19)]
DEPTHS = ((0, 2), (2, 5), (5, 6))
"""The candidates fed at depths 1, 2 and 3."""


def _grow(cache, nodes=NODES) -> torch.Tensor:
    """Feed ``nodes`` depth by depth after PREFIX; the logits of each."""
    with ModelTreeGrower(cache, len(PREFIX)) as grower:
        return torch.cat([grower.feed(nodes[a:b], list(range(a, b)), depth)
                          for depth, (a, b) in enumerate(DEPTHS, start=1)])


def _path(node: int) -> list[int]:
    return [NODES[i].token for i in path_to([n.parent for n in NODES], node)]


class _Counting:
    """Counts the positions a runner's forward passes feed."""

    def __init__(self, runner) -> None:
        self.fed, self._forward = 0, runner.forward
        runner.forward = self

    def __call__(self, input_ids, *args, **kwargs):
        self.fed += input_ids.shape[-1]
        return self._forward(input_ids, *args, **kwargs)


@AVX2_GAP
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("make", [tiny_llama, tiny_gemma2])
def test_invariant_tree_nodes_are_their_paths_fed_as_chains(make, dtype):
    runner = make(4)
    runner.model.to(dtype)
    runner.set_invariant()
    cache = runner.new_cache()
    cache.forward_to(PREFIX)
    logits = _grow(cache)
    for node in range(len(NODES)):
        chain = runner.new_cache().forward_to(PREFIX + _path(node)).logits[-1]
        assert torch.equal(logits[node], chain), node


@pytest.mark.parametrize("invariant", [True, False])
@pytest.mark.parametrize("make", [tiny_llama, tiny_gpt2])
def test_the_accepted_path_is_kept_in_place_and_not_fed_again(make, invariant):
    if invariant and make is tiny_gpt2:
        pytest.skip("the invariant attention runs rotary models")
    runner = make(5)
    if invariant:
        runner.set_invariant()
    for node, bonus in ((5, 44), (3, 8), (1, 61)):
        cache = runner.new_cache()
        cache.forward_to(PREFIX)
        _grow(cache)
        path = _path(node)
        counting = _Counting(runner)
        logits = cache.forward_to(PREFIX + path + [bonus]).logits[-1]
        runner.forward = counting._forward
        # only the verifier's own token (filler columns, in the invariant mode): the path was kept
        assert counting.fed == (runner.invariance.linear.pad(1) if invariant else 1)
        fresh = runner.new_cache()
        expected = fresh.forward_to(PREFIX + path + [bonus]).logits[-1]
        for kept, full in zip(cache.cache.layers, fresh.cache.layers):
            torch.testing.assert_close(kept.keys, full.keys, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(kept.values, full.values, atol=1e-5, rtol=1e-5)
        if invariant:
            assert torch.equal(logits, expected)
        else:
            torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)


def test_nodes_off_the_context_are_dropped_and_any_other_use_drops_them_all():
    runner = tiny_llama(6)
    cache = runner.new_cache()
    cache.forward_to(PREFIX)
    _grow(cache)
    assert cache.cache.get_seq_length() == len(PREFIX) + len(NODES)
    cache.forward_to(PREFIX + [NODES[0].token, 88, 5])  # leaves the tree after one node
    assert cache.tokens == PREFIX + [NODES[0].token, 88, 5]
    assert cache.cache.get_seq_length() == len(cache.tokens) and not cache.grown
    cache.rollback(len(PREFIX))
    _grow(cache)
    cache.extend([NODES[1].token])  # a use that names no path: the whole tree goes
    assert cache.cache.get_seq_length() == len(PREFIX) + 1 == len(cache.tokens)
    fresh = runner.new_cache().forward_to(PREFIX + [NODES[1].token, 4]).logits
    torch.testing.assert_close(cache.forward_to(cache.tokens + [4]).logits, fresh)


def test_a_failed_tree_leaves_the_committed_cache():
    runner = tiny_llama(7)
    cache = runner.new_cache()
    cache.forward_to(PREFIX)
    with pytest.raises(RuntimeError), ModelTreeGrower(cache, len(PREFIX)) as grower:
        grower.feed(NODES[:2], [0, 1], 1)
        raise RuntimeError("stopped")
    assert cache.cache.get_seq_length() == len(PREFIX) and not cache.grown


def test_a_drafted_tree_leaves_its_nodes_aside_for_the_next_round():
    runner = tiny_llama(8)
    cache = runner.new_cache()
    tokens, parents = draft_tree(cache, PREFIX, TreeShape(nodes=12, depth=4, branching=3))
    assert cache.tokens == PREFIX
    assert len(cache.grown) == cache.cache.get_seq_length() - len(PREFIX) > 0
    deepest = max(range(len(tokens)), key=lambda n: len(path_to(parents, n)))
    path = [tokens[i] for i in path_to(parents, deepest)]
    kept = sum(tuple(path[:d]) in cache.grown for d in range(1, len(path) + 1))
    assert kept >= min(len(path), 3)  # every depth but the last is fed
    counting = _Counting(runner)
    cache.forward_to(PREFIX + path + [1])
    assert counting.fed == len(path) - kept + 1
    assert cache.cache.get_seq_length() == len(PREFIX + path) + 1


@AVX2_GAP
def test_a_whole_tree_in_one_invariant_pass_is_its_paths_fed_as_chains():
    """``feed_tree`` (the pre-drafter's pass over every node, leaves included)."""
    runner = tiny_llama(9)
    runner.set_invariant()
    cache = runner.new_cache()
    cache.forward_to(PREFIX)
    parents = [n.parent for n in NODES]
    with ModelTreeGrower(cache, len(PREFIX)) as grower:
        logits = grower.feed_tree([n.token for n in NODES], parents)
    for node in range(len(NODES)):
        chain = runner.new_cache().forward_to(PREFIX + _path(node)).logits[-1]
        assert torch.equal(logits[node], chain), node
    assert len(cache.grown) == len(NODES)

"""CAPE's confidence-aware trees (cascade.core.proposers.tree.draft_confident_tree): the
drafter's own chain with as many runners-up at each position as its confidence asks for, fed
one token per depth like a chain; generating with them emits the target's greedy tokens
(keyed sampling with them: tests/core/proposers/test_tree_drafting.py)."""

import pytest
import torch

from cascade.core.loop import generate
from cascade.core.proposers.tree import (
    CONFIDENCE_WIDTHS,
    TreeShape,
    confidence_width,
    draft_confident_tree,
)
from cascade.protocol.settings import DraftConfig, SamplingParams
from cascade.protocol.acceptance import AcceptancePolicy, AcceptanceRule
from cascade.protocol.trees import depths, tree_problem
from models import hf_greedy, random_prompts, tiny_llama

PREFIX = [3, 17, 5, 40, 2, 9]


@pytest.mark.parametrize("confidence, width", [
    (0.05, 8), (0.3, 8), (0.31, 6), (0.6, 6), (0.7, 4), (0.8, 4), (0.81, 2), (1.0, 2)])
def test_the_width_follows_capes_schedule(confidence, width):
    assert confidence_width(confidence) == width


def test_a_confident_tree_is_the_chain_with_runners_up_where_the_drafter_is_unsure():
    drafter = tiny_llama(6)
    cache = drafter.new_cache()
    tokens, parents = draft_confident_tree(cache, PREFIX, TreeShape(nodes=64, depth=4,
                                                                    branching=1))
    assert tree_problem(parents, 64, 4) is None and max(depths(parents)) == 4
    assert cache.tokens == PREFIX and len(cache.grown) == 3  # the chain's fed tokens, aside
    chain = hf_greedy(drafter, PREFIX, 4)
    node, path = 0, []
    for depth in range(4):  # the chain: each position's best node; its siblings follow q
        at_depth = [i for i, d in enumerate(depths(parents)) if d == depth + 1]
        logits = drafter.new_cache().forward_to(PREFIX + chain[:depth]).logits[-1]
        q = torch.softmax(logits.float(), -1)
        assert len(at_depth) == confidence_width(float(q.max()))
        assert [tokens[i] for i in at_depth] == q.topk(len(at_depth)).indices.tolist()
        node = at_depth[0]
        assert tokens[node] == chain[depth] and parents[node] == (path[-1] if path else -1)
        assert all(parents[i] == parents[node] for i in at_depth)  # siblings of the chain's
        path.append(node)
    small, small_parents = draft_confident_tree(cache, PREFIX, TreeShape(5, 4, 1))
    assert len(small) == 5 and tree_problem(small_parents, 5, 4) is None


def _config(nodes: int = 12, k: int = 4) -> DraftConfig:
    return DraftConfig(num_draft_tokens=k, tree_nodes=nodes, tree_expansion="confidence")


def test_greedy_generation_with_confident_trees_is_the_targets_greedy_decoding(llama_pair):
    target, drafter = llama_pair
    for prompt in random_prompts(3, seed=21):
        result = generate(target, prompt, SamplingParams(max_new_tokens=20), drafter, _config())
        assert result.tokens == hf_greedy(target, prompt, 20)
        assert result.stats.mean_draft_length > 4  # trees, not chains of k = 4


def test_confident_trees_are_refused_where_they_do_not_apply():
    with pytest.raises(ValueError, match="tree_expansion must be one of"):
        DraftConfig(tree_nodes=8, tree_expansion="wide")
    with pytest.raises(ValueError, match="tree_expansion: the recursive rule"):
        _config().check(AcceptancePolicy(AcceptanceRule.RECURSIVE))
    _config().check(AcceptancePolicy(AcceptanceRule.KEYED))
    assert CONFIDENCE_WIDTHS[-1][0] == 1.0  # every confidence has a width

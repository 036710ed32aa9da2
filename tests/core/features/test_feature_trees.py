"""Token trees from the feature drafter: each depth's nodes are fed in one pass and give exactly
the logits of drafting their path one token at a time (each node's feature its parent's
output), the cache holds the committed context again afterwards, and generating with such
trees emits the target's greedy tokens (keyed: the tokens of k = 0)."""

import pytest
import torch

from cascade.core.features.feature_runner import FeatureRunner
from cascade.core.loop import generate
from cascade.core.proposers.tree import TreeShape, _Candidate, draft_confident_tree, draft_tree
from cascade.core.trees import path_to
from cascade.protocol.settings import DraftConfig, SamplingParams
from cascade.protocol.acceptance import AcceptancePolicy, AcceptanceRule
from cascade.protocol.trees import tree_problem
from models import feature_pair as make_feature_pair, full_forward
from models import hf_greedy, random_prompts

COMMITTED = random_prompts(1, seed=81, min_len=10, max_len=10)[0]
NODES = [_Candidate(0.0, -1, 10), _Candidate(0.0, -1, 24), _Candidate(0.0, 0, 6),
         _Candidate(0.0, 1, 30), _Candidate(0.0, 0, 2), _Candidate(0.0, 4, 18)]
"""Depth 1: nodes 0, 1; depth 2: nodes 2, 3, 4; depth 3: node 5."""


@pytest.fixture(scope="module")
def feature_pair(tmp_path_factory):
    target, target_dir, drafter_dir = make_feature_pair(tmp_path_factory.mktemp("feature"))
    return target, FeatureRunner.load(drafter_dir, target_dir)


def _cache(pair, num_features: int):
    """A drafter cache that has seen the target's features of the first ``num_features``
    committed positions (the rest are drafted from the drafter's own outputs)."""
    target, runner = pair
    with torch.inference_mode():
        hidden = full_forward(target.model, COMMITTED, output_hidden_states=True).hidden_states
    cache = runner.new_cache()
    cache.observe(0, torch.cat([hidden[i][0] for i in runner.feature_layers], -1)[:num_features])
    return cache


def _chain_logits(cache, tokens: list[int]) -> torch.Tensor:
    """The drafter's logits after the committed tokens and then each of ``tokens``, drafted one
    at a time as a chain is: [len(tokens) + 1, vocab]."""
    rows = [cache.forward_to(COMMITTED).logits[-1]]
    rows += [cache.extend([token]).logits[-1] for token in tokens]
    return torch.stack(rows)


@pytest.mark.parametrize("num_features", [len(COMMITTED) - 1, len(COMMITTED) - 3])
def test_each_fed_node_drafts_what_its_path_drafted_alone_gives(feature_pair, num_features):
    cache = _cache(feature_pair, num_features)
    cache.forward_to(COMMITTED)
    parents, tokens = [n.parent for n in NODES], [n.token for n in NODES]
    with cache.tree_grower(len(COMMITTED)) as grower:
        logits = torch.cat([grower.feed(NODES[:2], [0, 1], depth=1),
                            grower.feed(NODES[2:5], [2, 3, 4], depth=2),
                            grower.feed(NODES[5:], [5], depth=3)])  # [6, vocab]
    for node in range(len(NODES)):
        path = [tokens[i] for i in path_to(parents, node)]
        expected = _chain_logits(_cache(feature_pair, num_features), path)[-1]
        torch.testing.assert_close(logits[node], expected, atol=1e-5, rtol=1e-5)


def test_a_feature_tree_leaves_the_cache_holding_the_committed_context(feature_pair):
    cache = _cache(feature_pair, len(COMMITTED) - 1)
    tokens, parents = draft_tree(cache, COMMITTED, TreeShape(nodes=16, depth=4, branching=4))
    assert len(tokens) == 16 and tree_problem(parents, 16, 4) is None
    assert len(cache.entry_tokens) == len(cache.outputs) == cache.keys.shape[1]
    assert len(cache.entry_tokens) == len(COMMITTED) - 1
    chain = [4, 8, 12, 16]
    torch.testing.assert_close(_chain_logits(cache, chain),
                               _chain_logits(_cache(feature_pair, len(COMMITTED) - 1), chain),
                               atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("grow, nodes", [(draft_tree, 4), (draft_confident_tree, 32)])
def test_the_feature_drafters_greedy_chain_is_a_path_of_its_tree(feature_pair, grow, nodes):
    """A one-wide dynamic tree is the chain; a confident tree holds it beside runners-up."""
    shape = TreeShape(nodes=nodes, depth=4, branching=1, root_branching=1)
    tokens, parents = grow(_cache(feature_pair, len(COMMITTED) - 1), COMMITTED, shape)
    cache, greedy = _cache(feature_pair, len(COMMITTED) - 1), []
    logits = cache.forward_to(COMMITTED).logits[-1]
    for _ in range(4):
        greedy.append(int(logits.argmax()))
        logits = cache.extend(greedy[-1:]).logits[-1]
    node = -1
    for token in greedy:  # down the tree along the chain
        node = next(i for i, (t, p) in enumerate(zip(tokens, parents)) if (t, p) == (token, node))


def _trees(expansion: str = "dynamic", nodes: int = 12) -> DraftConfig:
    return DraftConfig(num_draft_tokens=4, tree_nodes=nodes, tree_branching=3,
                       tree_expansion=expansion)


@pytest.mark.parametrize("expansion", ["dynamic", "confidence"])
def test_greedy_with_feature_drafter_trees_equals_target_greedy(feature_pair, expansion):
    target, runner = feature_pair
    for prompt in random_prompts(3, seed=83):
        result = generate(target, prompt, SamplingParams(max_new_tokens=20), runner,
                          _trees(expansion))
        assert result.tokens == hf_greedy(target, prompt, 20)
        assert result.stats.num_draft_tokens > 4 * result.stats.num_target_passes // 2


def test_keyed_feature_drafter_trees_emit_the_tokens_of_decoding_alone(feature_pair):
    target, runner = feature_pair
    keyed = AcceptancePolicy(AcceptanceRule.KEYED)
    params = SamplingParams(temperature=0.8, seed=5, max_new_tokens=16)
    for prompt in random_prompts(2, seed=84):
        alone = generate(target, prompt, params, None, DraftConfig(0), policy=keyed).tokens
        assert generate(target, prompt, params, runner, _trees(), policy=keyed).tokens == alone


def test_recursive_feature_drafter_trees_run_and_stay_reproducible(feature_pair):
    target, runner = feature_pair
    recursive = AcceptancePolicy(AcceptanceRule.RECURSIVE)
    params = SamplingParams(temperature=0.8, seed=6, max_new_tokens=16)
    prompt = random_prompts(1, seed=85)[0]
    first = generate(target, prompt, params, runner, _trees(nodes=9), policy=recursive)
    again = generate(target, prompt, params, runner, _trees(nodes=9), policy=recursive)
    assert first.tokens == again.tokens and len(first.tokens) == 16
    assert first.stats.num_draft_tokens > first.stats.num_target_passes


@pytest.mark.parametrize("config", [DraftConfig(4), _trees()], ids=["chain", "tree"])
def test_a_one_token_prompt_drafts_nothing_until_the_drafter_has_an_entry(feature_pair, config):
    target, runner = feature_pair
    result = generate(target, [7], SamplingParams(max_new_tokens=8), runner, config)
    assert result.tokens == hf_greedy(target, [7], 8)
    assert result.stats.num_draft_tokens > 0  # from the second round on

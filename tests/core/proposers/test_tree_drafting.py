"""Token trees from the drafter model: each depth's nodes are fed in one pass and see exactly
their ancestors, the tree is ancestor-closed and within its shape, and generating with trees
emits the target's greedy tokens (and, keyed, the tokens of k = 0) whatever the drafter."""

import copy

import pytest
import torch

from cascade.core.loop import generate
from cascade.core.proposers import ProposerContext, guesser, new_proposer
from cascade.core.proposers.ngram import ngram_continuations, ngram_propose, trie
from cascade.core.model.tree_grower import ModelTreeGrower
from cascade.core.proposers.tree import TreeShape, _Candidate, draft_tree
from cascade.core.model.runner import ModelRunner
from cascade.core.trees import path_to
from cascade.protocol.trees import depths, tree_problem
from cascade.protocol.settings import DraftConfig, SamplingParams
from cascade.protocol.acceptance import AcceptancePolicy, AcceptanceRule
from models import hf_greedy, random_prompts, tiny_gpt2, tiny_llama

PREFIX = [3, 17, 5, 40, 2, 9]


@pytest.mark.parametrize("make", [tiny_llama, tiny_gpt2])
def test_each_fed_node_sees_the_prefix_and_its_ancestors_only(make):
    drafter = make(5)
    cache = drafter.new_cache()
    cache.forward_to(PREFIX)
    grower = ModelTreeGrower(cache, len(PREFIX))
    nodes = [_Candidate(0.0, -1, 11), _Candidate(0.0, -1, 23),
             _Candidate(0.0, 0, 7), _Candidate(0.0, 1, 30), _Candidate(0.0, 0, 2),
             _Candidate(0.0, 4, 19)]
    parents = [n.parent for n in nodes]
    tokens = [n.token for n in nodes]
    logits = torch.cat([grower.feed(nodes[:2], [0, 1], depth=1),
                        grower.feed(nodes[2:5], [2, 3, 4], depth=2),
                        grower.feed(nodes[5:], [5], depth=3)])
    for node in range(len(nodes)):
        path = [tokens[i] for i in path_to(parents, node)]
        expected = drafter.new_cache().forward_to(PREFIX + path).logits[-1]
        torch.testing.assert_close(logits[node], expected, atol=1e-4, rtol=1e-4)


def test_a_tree_is_ancestor_closed_within_its_shape_and_leaves_the_cache_committed():
    drafter = tiny_llama(6)
    cache = drafter.new_cache()
    shape = TreeShape(nodes=12, depth=4, branching=3)
    tokens, parents = draft_tree(cache, PREFIX, shape)
    assert len(tokens) == 12 and tree_problem(parents, 12, 4) is None
    assert max(depths(parents)) <= 4
    assert cache.tokens == PREFIX  # the fed nodes wait aside (tests/core/proposers/test_tree_kv.py)
    # The root's best child is the drafter's argmax; a one-wide tree is the greedy chain.
    first = drafter.new_cache().forward_to(PREFIX).logits[-1].argmax()
    assert tokens[0] == int(first)
    chain, chain_parents = draft_tree(cache, PREFIX, TreeShape(4, 4, 1, root_branching=1))
    assert chain_parents == [-1, 0, 1, 2]
    assert chain == hf_greedy(drafter, PREFIX, 4)
    wide, wide_parents = draft_tree(cache, PREFIX, TreeShape(nodes=64, depth=2, branching=2))
    assert wide_parents.count(-1) == 8  # the root offers 4 x branching candidates


def _tree_config(nodes: int = 10, k: int = 4, branching: int = 3,
                 expansion: str = "dynamic") -> DraftConfig:
    return DraftConfig(num_draft_tokens=k, tree_nodes=nodes, tree_branching=branching,
                       tree_expansion=expansion)


def test_greedy_generation_with_trees_is_the_targets_greedy_decoding(llama_pair):
    target, drafter = llama_pair
    for prompt in random_prompts(3, seed=11):
        params = SamplingParams(max_new_tokens=20)
        result = generate(target, prompt, params, drafter, _tree_config())
        assert result.tokens == hf_greedy(target, prompt, 20)


def _sharpened(runner: ModelRunner, factor: float = 20.0) -> ModelRunner:
    """A copy of ``runner`` with the same argmax and a sharper distribution."""
    model = copy.deepcopy(runner.model)
    model.get_output_embeddings().weight.data *= factor
    return ModelRunner(model)


def test_a_confident_drafter_that_agrees_gets_whole_paths_accepted(llama_pair):
    target, _ = llama_pair
    prompt = random_prompts(1, seed=12)[0]
    result = generate(target, prompt, SamplingParams(max_new_tokens=21), _sharpened(target),
                      _tree_config(k=4))
    assert result.tokens == hf_greedy(target, prompt, 21)
    assert result.stats.num_target_passes == 5  # 4 accepted + 1 bonus per round, 4 rounds


@pytest.mark.parametrize("expansion", ["dynamic", "confidence"])
def test_keyed_sampling_with_trees_emits_the_tokens_of_decoding_alone(llama_pair, expansion):
    target, drafter = llama_pair
    keyed = AcceptancePolicy(AcceptanceRule.KEYED)
    for prompt in random_prompts(2, seed=13):
        params = SamplingParams(temperature=0.8, top_p=0.95, seed=7, max_new_tokens=16)
        alone = generate(target, prompt, params, None, DraftConfig(num_draft_tokens=0),
                         policy=keyed).tokens
        chain = generate(target, prompt, params, drafter, DraftConfig(), policy=keyed).tokens
        tree = generate(target, prompt, params, drafter, _tree_config(expansion=expansion),
                        policy=keyed).tokens
        same_model = generate(target, prompt, params, target,
                              _tree_config(expansion=expansion), policy=keyed)
        assert alone == chain == tree == same_model.tokens
        assert same_model.stats.num_accepted_tokens > 0


def test_trees_are_refused_where_they_cannot_be_verified_or_drafted(llama_pair):
    with pytest.raises(ValueError, match="tree_nodes must be in"):
        DraftConfig(tree_nodes=65)
    with pytest.raises(ValueError, match="tree_nodes: token trees are drafted with a fixed k"):
        DraftConfig(tree_nodes=8, adaptive=True)
    with pytest.raises(ValueError, match="greedy, keyed or recursive rule"):
        _tree_config().check(AcceptancePolicy(AcceptanceRule.SPECULATIVE))
    _tree_config().check(AcceptancePolicy(AcceptanceRule.KEYED))
    target, drafter = llama_pair
    context = ProposerContext(drafter, SamplingParams(), _tree_config(), prompt_len=3)
    assert guesser(new_proposer(context)) is not None  # pre-drafting during verification
    sampled = ProposerContext(drafter, SamplingParams(temperature=1.0), _tree_config(),
                              AcceptancePolicy(AcceptanceRule.RECURSIVE), prompt_len=3)
    assert guesser(new_proposer(sampled)) is None  # its last token comes from a residual


def test_prompt_lookup_merges_every_earlier_match_into_a_trie():
    context = [1, 2, 3, 4, 9, 1, 2, 3, 5, 6, 1, 2, 3, 4, 7, 1, 2, 3]
    found = ngram_continuations(context, 2, max_n=3)
    assert found == [[4, 7], [5, 6], [4, 9]]  # the most recent first
    assert trie(found, 8) == ([4, 7, 5, 6, 9], [-1, 0, -1, 2, 0])
    assert trie(found, 3) == ([4, 7, 5], [-1, 0, -1])
    assert ngram_propose(context, 2, max_n=3) == [4, 7]
    config = DraftConfig(num_draft_tokens=2, method="ngram", tree_nodes=8, ngram_max_n=3)
    draft = new_proposer(ProposerContext(None, SamplingParams(), config)).propose(context, 8)
    assert (draft.tokens, draft.parents) == ([4, 7, 5, 6, 9], [-1, 0, -1, 2, 0])


def test_greedy_generation_with_prompt_lookup_trees_is_exact(llama_pair):
    target, _ = llama_pair
    prompt = random_prompts(1, seed=15)[0] * 3  # repeats: several matches to branch on
    config = DraftConfig(num_draft_tokens=3, method="ngram", tree_nodes=8, ngram_min_n=1)
    result = generate(target, prompt, SamplingParams(max_new_tokens=16), None, config)
    assert result.tokens == hf_greedy(target, prompt, 16)

"""The chain-vs-tree comparison: configs parse as documented, every config of a greedy run emits
the same tokens, and the tallies count what the rounds did."""

import argparse

import pytest

from cascade.distill.tree_eval import Tally, label, parse_config, run_one
from cascade.protocol.settings import SamplingParams
from cascade.protocol.acceptance import AcceptancePolicy, AcceptanceRule
from models import random_prompts


def test_configs_parse_as_documented():
    assert parse_config("0").num_draft_tokens == 0
    tree = parse_config("4:16:3")
    assert (tree.num_draft_tokens, tree.tree_nodes, tree.tree_branching) == (4, 16, 3)
    assert label(tree) == "tree: depth 4, 16 nodes, branching 3"
    assert label(parse_config("4")) == "chain k=4"
    cape = parse_config("4:16:4:confidence")
    assert (cape.tree_nodes, cape.tree_expansion) == (16, "confidence")
    assert label(cape) == "CAPE tree: depth 4, 16 nodes"
    for bad in ("4:16", "4:16:4:wide", "a:16:4"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_config(bad)


def test_chains_and_trees_emit_the_same_greedy_tokens_and_are_tallied(llama_pair):
    target, drafter = llama_pair
    prompt = random_prompts(1, seed=21)[0]
    params = SamplingParams(max_new_tokens=12)
    greedy = AcceptancePolicy(AcceptanceRule.GREEDY)
    tallies = {text: Tally() for text in ("0", "3", "3:10:3", "3:10:3:confidence")}
    outputs = [run_one(target, drafter, prompt, params, parse_config(text), greedy, tally)
               for text, tally in tallies.items()]
    assert outputs[0] == outputs[1] == outputs[2] == outputs[3] and len(outputs[0]) == 12
    alone, tree = tallies["0"], tallies["3:10:3"]
    alone, tree = alone.stats, tree.stats
    assert alone.num_target_passes == 12 and alone.num_draft_tokens == 0
    assert alone.num_emitted_tokens == 12
    assert tree.num_target_passes <= 12 and tallies["3:10:3"].seconds > 0
    assert 0 < tree.num_draft_tokens <= 10 * tree.num_target_passes

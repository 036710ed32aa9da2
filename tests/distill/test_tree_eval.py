"""The chain-vs-tree comparison: configs parse as documented (a bad one is a usage error), every
config of a greedy run emits the same tokens, and the tallies count what the rounds did."""

import typing

import pytest
from typer.testing import CliRunner

from cascade.bench.prompts import domain_names
from cascade.distill.measure.tree_eval import (TreeEvalSettings, Tally, label, parse_config, run,
                                       run_one)
from cascade.serving.settings_cli import settings_command
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
        with pytest.raises(ValueError):
            parse_config(bad)


def test_the_command_line_checks_configs_and_knows_every_domain():
    assert [label(c) for c in TreeEvalSettings().draft_configs()] == [
        "target alone", "chain k=4", "tree: depth 4, 8 nodes, branching 2",
        "tree: depth 4, 16 nodes, branching 4"]
    result = CliRunner().invoke(settings_command(TreeEvalSettings, run),
                                ["--config", "4", "--config", "4:16"])
    assert result.exit_code == 2 and "--config" in result.output, result.output
    domains = typing.get_args(TreeEvalSettings.model_fields["domain"].annotation)
    assert set(domains) == {*domain_names(), "held-out"}


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

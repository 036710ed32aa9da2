"""The structured-outputs benchmark runs every mode and checks what it claims (no speed
assertions): outputs under a grammar that finished validate, and speculation under a grammar
emits what the target alone under it does."""

import pytest

from cascade.bench.drafting.structured import SCHEMAS, Tally, measure, modes, run_mode
from cascade.core.model.runner import ModelRunner, ModelSpec
from cascade.tools.tiny_models import build_tiny_pair


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    target_dir, drafter_dir = build_tiny_pair(tmp_path_factory.mktemp("models"))
    return (ModelRunner.load(ModelSpec(str(target_dir))),
            ModelRunner.load(ModelSpec(str(drafter_dir))))


def test_every_mode_runs_and_grammar_outputs_validate(pair):
    target, drafter = pair
    tallies = measure(target, drafter, max_tokens=24, k=2)
    assert list(tallies) == [name for name, _, _ in modes(2)]
    for name, tally in tallies.items():
        assert tally.tokens > 0 and tally.seconds > 0
        assert tally.valid <= tally.finished <= len(SCHEMAS)
    assert tallies["k=2 + grammar"].stats.num_draft_tokens > 0


def test_a_finished_output_is_checked_against_its_schema(pair):
    target, drafter = pair
    schema = {"enum": ["yes", "no"]}  # always finishes within a few tokens
    tally = Tally()
    tokens = run_mode(target, drafter, [1, 2, 3], schema, ("k=2 + grammar", 2, True), 24,
                      tally)
    assert tally.finished == tally.valid == 1
    assert tokens[-1] == target.tokenizer.eos_token_id

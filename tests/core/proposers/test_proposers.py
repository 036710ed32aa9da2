"""Proposers as plug-ins: every registered method loads by name, a new method is one module and
one registration, and a proposer can receive per-position data from the verifier."""

import pytest
import torch

from cascade.core import proposers
from cascade.core.blocks import Draft
from cascade.core.loop import generate
from cascade.core.proposers import Proposer, ProposerContext, TargetFeatures, load
from cascade.protocol import methods
from cascade.protocol.request.options import validate_options
from cascade.protocol.settings import DraftConfig, SamplingParams
from models import random_prompts


class RepeatLastProposer(Proposer):
    """A method for this test only: propose the last committed token again."""

    needs_model = False
    wants_target_features = True

    def __init__(self, context: ProposerContext) -> None:
        super().__init__(context)
        self.features: list[TargetFeatures] = []

    def propose(self, committed: list[int], num_tokens: int, stop=None) -> Draft:
        return Draft([committed[-1]] * num_tokens)

    def observe(self, features: TargetFeatures) -> None:
        self.features.append(features)


@pytest.mark.parametrize("name", sorted(methods.DRAFT_METHODS))
def test_every_registered_method_loads_as_a_proposer(name):
    assert issubclass(load(name), Proposer)


def test_an_unknown_method_is_refused_by_name():
    with pytest.raises(ValueError, match="telepathy"):
        load("telepathy")
    with pytest.raises(ValueError, match="draft method must be one of"):
        DraftConfig(method="telepathy")


def test_a_new_method_is_one_class_and_one_registration(monkeypatch, gpt2_pair):
    monkeypatch.setitem(methods.DRAFT_METHODS, "repeat_last", f"{__name__}:RepeatLastProposer")
    assert validate_options({"draft_method": "repeat_last"}).draft_method == "repeat_last"
    target, _ = gpt2_pair
    prompt = random_prompts(1, seed=12)[0]
    params = SamplingParams(max_new_tokens=16)
    plain = generate(target, prompt, params)
    repeated = generate(target, prompt, params, None, DraftConfig(3, method="repeat_last"))
    assert repeated.tokens == plain.tokens  # still exact: only the drafts came from the plug-in
    assert repeated.stats.num_draft_tokens > 0


def test_a_proposer_receives_per_position_data():
    context = ProposerContext(None, SamplingParams(), DraftConfig(method="ngram"))
    proposer = RepeatLastProposer(context)
    features = TargetFeatures(start=5, hidden_states=torch.zeros(2, 8))
    proposer.observe(features)
    assert proposer.features == [features]
    assert load("ngram")(context).observe(features) is None  # ignored where not wanted


def test_a_method_that_needs_the_model_refuses_to_run_without_one():
    with pytest.raises(ValueError, match="needs a drafter model"):
        proposers.new_proposer(ProposerContext(None, SamplingParams(), DraftConfig()))

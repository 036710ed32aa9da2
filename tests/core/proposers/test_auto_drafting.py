"""The default drafting method's chooser and the client's predicted output as a source:
synthetic sources for the choice, the prediction's join after an edit, and exact output in the
loop whatever the prediction."""

from collections import Counter

import pytest
import torch
from scipy.stats import chisquare

from cascade.core.loop import generate, speculative_rounds
from cascade.core.proposers import ProposerContext, guesser
from cascade.core.proposers.auto import MODEL, AutoProposer, Option, best, rate
from cascade.core.proposers.base import RoundCosts
from cascade.core.proposers.prediction import PredictionLookup
from cascade.protocol.settings import DraftConfig, SamplingParams
from models import full_forward, hf_greedy, tiny_llama

COSTS = RoundCosts(round_s=0.05, alone_s=0.04, draft_token_s=0.01)


def test_the_source_expecting_more_per_second_wins():
    free = Option("lookup", expected=1.5)
    model = Option(MODEL, expected=2.0, model_tokens=4)  # 3.0 / 0.09 < 2.5 / 0.05
    assert best([model, free], COSTS).source == "lookup"
    assert best([model, Option("lookup", expected=0.2)], COSTS).source == MODEL
    cheap_model = RoundCosts(round_s=0.05, draft_token_s=0.0001)
    assert best([model, free], cheap_model).source == MODEL
    assert best([], COSTS) is None


def test_ties_keep_the_previous_source_then_the_order_given():
    a, b = Option("lookup", 1.0), Option("prediction", 1.0)
    assert rate(a, COSTS) == rate(b, COSTS)
    assert best([a, b], COSTS).source == "lookup"
    assert best([a, b], COSTS, previous="prediction").source == "prediction"
    assert best([b, a], COSTS, previous="lookup").source == "lookup"


def test_a_prediction_that_stops_holding_stops_being_chosen():
    lookup = PredictionLookup(list(range(100, 140)), prompt_len=0, max_tokens=32)
    model = Option(MODEL, expected=1.2, model_tokens=4)
    first = lookup.propose([], 16)
    assert first.tokens == list(range(100, 116))
    assert best([Option("prediction", first.expected), model], COSTS).source == "prediction"
    for _ in range(12):  # the output keeps rejecting its first token
        lookup.judged(16, 0)
    again = lookup.propose([], 16)
    assert again.expected < 0.5
    assert best([Option("prediction", again.expected), model], COSTS).source == MODEL


def test_the_output_rejoins_the_prediction_after_an_edit():
    prediction = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 3, 4, 11, 12]
    lookup = PredictionLookup(prediction, prompt_len=2, max_tokens=32)
    prompt = [50, 51]
    assert lookup.propose(prompt, 3).tokens == [1, 2, 3]
    assert lookup.propose(prompt + [1, 2, 3], 3).tokens == [4, 5, 6]
    edited = prompt + [1, 2, 3, 4, 40, 41]  # an edit: 40 41 is new
    assert lookup.propose(edited, 3).tokens == []
    rejoined = edited + [6, 7]  # back on the prediction after the edited line
    assert lookup.propose(rejoined, 3).tokens == [8, 9, 10]
    # "3 4" occurs twice: the output has moved past the first, so the second is the place
    later = rejoined + [8, 9, 10, 3, 4]
    assert lookup.propose(later, 5).tokens == [11, 12]


@pytest.fixture(scope="module")
def pair():
    return tiny_llama(0), tiny_llama(1)


PROMPT = [5, 9, 11, 3, 7, 2]


@pytest.mark.parametrize("kind", ["none", "empty", "right", "wrong", "edited", "rejoining"])
def test_greedy_output_is_the_targets_whatever_the_prediction(pair, kind):
    target, drafter = pair
    reference = hf_greedy(target, PROMPT, 40)
    prediction = {"none": None, "empty": [], "right": reference, "wrong": [4] * 40,
                  "edited": reference[:12] + [1, 2, 3] + reference[15:],
                  "rejoining": reference[:10] + [7, 7] + reference[10:]}[kind]
    config = DraftConfig(4, method="auto", prediction=tuple(prediction or ()))
    params = SamplingParams(temperature=0.0, max_new_tokens=40)
    accepted = {}
    for draft, outcome, verifier in speculative_rounds(target, PROMPT, params, drafter, config):
        accepted[draft.source] = accepted.get(draft.source, 0) + outcome.num_accepted
        generated = list(verifier.generated)
    assert generated == reference
    if kind in ("right", "edited", "rejoining"):
        assert accepted.get("prediction", 0) >= 30  # the prediction's stretches were taken
    if kind in ("none", "empty"):
        assert "prediction" not in accepted


def test_without_a_drafter_model_it_drafts_from_free_sources_only(pair):
    target, _ = pair
    reference = hf_greedy(target, PROMPT, 24)
    config = DraftConfig(4, method="auto", prediction=tuple(reference))
    proposer = AutoProposer(ProposerContext(None, SamplingParams(temperature=0.0,
                                                                 max_new_tokens=24), config,
                                            prompt_len=len(PROMPT)))
    assert proposer.model is None and guesser(proposer) is None
    assert proposer.propose(PROMPT, 8).tokens == reference[:8]
    assert proposer.propose(PROMPT + [99999], 8).tokens == []  # nothing joins: no draft


def test_sampling_from_a_prediction_keeps_the_targets_distribution(gpt2_pair):
    """Prediction drafts carry no q (verified as point masses): the first emitted token of a
    sampled generation is distributed as the target's p, whether the prediction starts with a
    likely token or an unlikely one (chi-square over the target's likeliest tokens)."""
    target, _ = gpt2_pair
    prompt = [3, 14, 15, 9, 2, 6]
    with torch.no_grad():
        p = torch.softmax(full_forward(target.model, prompt).logits[0, -1].double(), -1)
    order = torch.argsort(p, descending=True).tolist()
    runs = 1200
    for predicted in (order[0], order[5]):
        config = DraftConfig(4, method="auto", prediction=(predicted, 1, 2))
        counts = Counter()
        for seed in range(runs):
            params = SamplingParams(max_new_tokens=2, temperature=1.0, seed=seed)
            result = generate(target, prompt, params, None, config)
            assert result.stats.num_draft_tokens >= 1  # the prediction drafted
            counts[result.tokens[0]] += 1
        top = order[:8]
        observed = [counts[t] for t in top] + [runs - sum(counts[t] for t in top)]
        expected = [runs * float(p[t]) for t in top] + [runs * float(1 - p[top].sum())]
        assert chisquare(observed, expected).pvalue > 1e-3


def test_a_lookup_source_whose_claims_fail_is_trusted_less(pair):
    """A match that occurred once claims every token; when such blocks keep failing, the
    session scales its source's estimates down and the model wins the round."""
    target, drafter = pair
    config = DraftConfig(4, method="auto")
    params = SamplingParams(temperature=0.0, max_new_tokens=40)
    proposer = AutoProposer(ProposerContext(drafter, params, config, prompt_len=3))
    committed = [7, 8, 9, 1, 2, 3, 4, 7, 8, 9]  # "7 8 9" occurred before: a lookup draft
    option, draft = proposer._choose(committed, 4)
    assert option.source == "lookup" and draft.tokens == [1, 2, 3]  # as far as it matched
    assert proposer.guesses_after("", 4) and proposer.guesses_after(draft.source, 3)
    assert not proposer.guesses_after(draft.source, 5)  # longer than k: known at once
    for _ in range(8):
        proposer.propose(committed, 4)
        proposer.judged(draft.source, 3, 0)  # the target never agreed
    assert proposer.trust[draft.source].factor < 0.2
    option, _ = proposer._choose(committed, 4)
    assert option.source == MODEL


def test_a_prediction_whose_blocks_keep_failing_is_trusted_less(pair):
    """The prediction's own rates learn position by position; a block rejected at its first
    token (a join on two tokens of prose) also lowers how far the source's claims are trusted,
    so the model wins the round; a prediction that holds keeps its claims."""
    _, drafter = pair
    config = DraftConfig(4, method="auto", prediction=tuple(range(200, 240)))
    params = SamplingParams(temperature=0.0, max_new_tokens=40)
    proposer = AutoProposer(ProposerContext(drafter, params, config, prompt_len=3))
    prompt = [7, 8, 9]
    first = proposer.propose(prompt, 16)
    assert first.source == "prediction" and first.tokens == list(range(200, 216))
    proposer.judged("prediction", 16, 16)
    assert proposer.trust["prediction"].factor >= 1.0  # held: trusted as claimed
    for _ in range(6):  # the target rejects the first token every time
        proposer.propose(prompt, 16)
        proposer.judged("prediction", 16, 0)
    raw = proposer.prediction.propose(prompt, 16)
    assert proposer._expected(raw) < 0.2 * raw.expected
    assert proposer._choose(prompt, 16)[0].source == MODEL

"""Sampling stays exact with the request processors on: with logit_bias and the three penalties,
speculative sampling (the drafter's q shaped by the same processors, as the model drafter does,
or unshaped, as trees and prompt lookup draft) and the keyed rule emit tokens distributed as
the target's shaped distribution, at the first position and at the second, whose penalties
count the first token, which was drafted (chi-square against a slow reference that shapes one
full forward pass per token)."""

from collections import Counter

import pytest
import torch
from scipy.stats import chisquare

from cascade.core.loop import generate
from cascade.protocol.settings import DraftConfig, SamplingParams
from cascade.protocol.acceptance import AcceptancePolicy, AcceptanceRule
from models import full_forward, penalized, random_prompts

BIAS = ((7, 6.0), (11, -2.0))
PRESENCE, FREQUENCY, REPETITION = 2.0, 0.75, 1.4
RUNS = 1500


def _shaped(target, prompt: list[int], generated: list[int]) -> torch.Tensor:
    """The slow reference: the target's distribution after ``generated``, with the bias, then
    repetition (over the prompt and generated), presence and frequency (over generated)."""
    with torch.no_grad():
        logits = full_forward(target.model, prompt + generated).logits[0, -1].double()
    for token, bias in BIAS:
        logits[token] += bias
    return torch.softmax(penalized(logits, prompt, generated, PRESENCE, FREQUENCY, REPETITION),
                         -1)


def _fits(observed: Counter, p: torch.Tensor, total: int) -> float:
    """Chi-square p-value of ``observed`` against ``total`` draws from ``p``; cells expected
    fewer than 5 times are pooled."""
    expected = p * total
    big = [t for t in range(len(p)) if expected[t] >= 5]
    rest_expected = total - sum(expected[t].item() for t in big)
    rest_observed = total - sum(observed[t] for t in big)
    f_obs = [observed[t] for t in big] + [rest_observed]
    f_exp = [expected[t].item() for t in big] + [rest_expected]
    return chisquare(f_obs, f_exp).pvalue


@pytest.mark.parametrize("rule, shaped", [(AcceptanceRule.SPECULATIVE, True),
                                           (AcceptanceRule.SPECULATIVE, False),
                                           (AcceptanceRule.KEYED, True)],
                         ids=["speculative-shaped-q", "speculative-unshaped-q", "keyed"])
def test_sampling_with_bias_and_penalties_has_the_shaped_distribution(llama_pair, monkeypatch,
                                                                       rule, shaped):
    import cascade.core.proposers.model as model_proposer

    if not shaped:
        monkeypatch.setattr(model_proposer, "_shaper", lambda context: None)
    target, drafter = llama_pair
    prompt = random_prompts(1, seed=31)[0]
    firsts, seconds = Counter(), []
    for seed in range(RUNS):
        params = SamplingParams(temperature=1.0, seed=seed, max_new_tokens=2, logit_bias=BIAS,
                                presence_penalty=PRESENCE, frequency_penalty=FREQUENCY,
                                repetition_penalty=REPETITION)
        tokens = generate(target, prompt, params, drafter, DraftConfig(num_draft_tokens=3),
                          AcceptancePolicy(rule)).tokens
        firsts[tokens[0]] += 1
        seconds.append(tokens)
    p_first = _shaped(target, prompt, [])
    assert _fits(firsts, p_first, RUNS) > 1e-3
    common = firsts.most_common(1)[0][0]
    after = Counter(t[1] for t in seconds if t[0] == common)
    total = sum(after.values())
    assert total > 200
    p_second = _shaped(target, prompt, [common])
    assert p_second[common] < _shaped(target, prompt, [])[common]  # the penalty bites
    assert _fits(after, p_second, total) > 1e-3

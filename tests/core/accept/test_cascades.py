"""Speculative cascades: hand-computed targets, the fast rules against their slow references on
random inputs, the limits of alpha, and (statistically) emitted tokens distributed as pi."""

import pytest
import torch

from cascade.core.accept.acceptance import AcceptanceInput, accept
from cascade.core.accept.cascades import SEQUENCE_RULES, TOKEN_RULES, cascade_target
from cascade.core.accept.cascades_reference import cascade_target_reference
from cascade.protocol.settings import SamplingParams
from cascade.protocol.acceptance import AcceptanceRule
from distributions import N, VOCAB, assert_matches, random_distribution

RULES = [*SEQUENCE_RULES, *TOKEN_RULES]
P = [0.6, 0.3, 0.1]
Q = [0.2, 0.7, 0.1]

# (rule, alpha, drafted, pi, deferred), worked by hand from the formulas (p = P, q = Q; TV = 0.4)
CASES = [
    ("chow", 0.3, 1, Q, False),  # max q 0.7 >= 1 - 0.3
    ("chow", 0.2, 1, P, True),  # 0.7 < 0.8
    ("diff", 0.0, 1, Q, False),  # 0.7 >= 0.6
    ("opt", 0.0, 1, Q, False),  # 0.7 >= 0.6 - 0
    ("token_v1", 0.0, 1, [0.18, 0.79, 0.03], False),  # A = {1}: q(1) >= 0.6
    ("token_v1", 0.0, 0, [0.18, 0.79, 0.03], True),
    ("token_v2", 0.0, 1, [0.68, 0.24, 0.08], True),  # A = {0}
    ("token_v3", 0.5, 1, [0.26, 0.73, 0.01], False),  # A = {0, 1}: p >= 0.3
]


@pytest.mark.parametrize("name, alpha, drafted, pi, deferred", CASES)
def test_hand_computed_targets(name, alpha, drafted, pi, deferred):
    p, q = torch.tensor([[P]], dtype=torch.float64), torch.tensor([[Q]], dtype=torch.float64)
    got, got_deferred = cascade_target(name, alpha, p, q, p, q, torch.tensor([[drafted]]))
    torch.testing.assert_close(got[0, 0], torch.tensor(pi, dtype=torch.float64))
    assert bool(got_deferred[0, 0]) == deferred
    assert cascade_target_reference(name, alpha, P, Q, P, Q, drafted)[1] == deferred


@pytest.mark.parametrize("name", RULES)
def test_fast_rules_agree_with_the_reference(name):
    generator = torch.Generator().manual_seed(1)
    shape = (3, 4, 9)
    p_dec, q_dec, p, q = (torch.rand(shape, generator=generator, dtype=torch.float64).pow(3)
                          for _ in range(4))
    p_dec, q_dec, p, q = (t / t.sum(-1, keepdim=True) for t in (p_dec, q_dec, p, q))
    drafted = torch.randint(0, 9, shape[:2], generator=generator)
    for alpha in (0.0, 0.1, 0.35, 1.0):
        pi, deferred = cascade_target(name, alpha, p_dec, q_dec, p, q, drafted)
        torch.testing.assert_close(pi.sum(-1), torch.ones(shape[:2], dtype=torch.float64))
        for b in range(shape[0]):
            for i in range(shape[1]):
                ref_pi, ref_deferred = cascade_target_reference(
                    name, alpha, p_dec[b, i].tolist(), q_dec[b, i].tolist(), p[b, i].tolist(),
                    q[b, i].tolist(), int(drafted[b, i]))
                torch.testing.assert_close(pi[b, i], torch.tensor(ref_pi, dtype=torch.float64))
                assert bool(deferred[b, i]) == ref_deferred


def _batch(p, q, alpha, seed, rule_q=None):
    """N one-draft rows, drafts sampled from q, target logits log p, seeded uniforms."""
    generator = torch.Generator().manual_seed(seed)
    drafts = torch.multinomial(q.float(), N, replacement=True, generator=generator)
    logits = torch.stack([p, torch.full((VOCAB,), 1.0 / VOCAB, dtype=torch.float64)]).log()
    return AcceptanceInput(
        draft_tokens=drafts[:, None], num_draft=torch.ones(N, dtype=torch.long),
        target_logits=logits.float().expand(N, 2, VOCAB), sampling=SamplingParams(temperature=1.0),
        draft_probs=q.expand(N, 1, VOCAB), alpha=alpha,
        u_accept=torch.rand(N, 1, generator=generator, dtype=torch.float64),
        u_sample=torch.rand(N, 2, generator=generator, dtype=torch.float64)), drafts


def _first_tokens(rule, batch, drafts):
    result = accept(rule, batch)
    return torch.where(result.num_accepted == 1, drafts, result.next_token), result


@pytest.mark.parametrize("rule", [r for r in AcceptanceRule if not r.is_lossless])
@pytest.mark.parametrize("alpha", [0.1, 0.4])
def test_emitted_tokens_follow_the_cascade_target(rule, alpha):
    p, q = random_distribution(11, zeros=2), random_distribution(12)
    p = p.float().log().softmax(-1).double()  # p as the rule sees it through the logits
    batch, drafts = _batch(p, q, alpha, seed=4)
    first, result = _first_tokens(rule, batch, drafts)
    pi, _ = cascade_target(rule.value, alpha, p[None, None], q[None, None], p[None, None],
                           q[None, None], torch.tensor([[0]]))
    assert_matches(first, pi[0, 0])
    assert result.num_deferred is not None


def test_chow_at_alpha_zero_is_lossless_speculative_sampling_on_the_same_numbers():
    p, q = random_distribution(13), random_distribution(14)  # max q < 1: every position defers
    batch, drafts = _batch(p, q, 0.0, seed=5)
    cascade, result = _first_tokens(AcceptanceRule.CHOW, batch, drafts)
    lossless, _ = _first_tokens(AcceptanceRule.SPECULATIVE, batch, drafts)
    assert torch.equal(cascade, lossless)
    assert int(result.num_deferred.sum()) == N


def test_chow_at_alpha_one_always_keeps_the_drafted_token():
    p, q = random_distribution(15), random_distribution(16)
    batch, drafts = _batch(p, q, 1.0, seed=6)
    result = accept(AcceptanceRule.CHOW, batch)
    assert bool((result.num_accepted == 1).all()) and int(result.num_deferred.sum()) == 0


def test_greedy_cascade_keeps_a_confident_drafter_and_defers_an_unsure_one():
    logits = torch.log(torch.tensor([[[0.6, 0.3, 0.1], [0.2, 0.2, 0.6]]]))  # [1, k+1, 3]
    confident = torch.tensor([[[0.05, 0.9, 0.05]]])
    unsure = torch.tensor([[[0.3, 0.4, 0.3]]])
    for q, accepted, deferred in ((confident, 1, 0), (unsure, 0, 1)):
        batch = AcceptanceInput(torch.tensor([[1]]), torch.tensor([1]), logits,
                                SamplingParams(), draft_probs=q, alpha=0.2)
        result = accept(AcceptanceRule.CHOW, batch)
        assert int(result.num_accepted[0]) == accepted and int(result.num_deferred[0]) == deferred
        assert int(result.next_token[0]) == (2 if accepted else 0)  # bonus argmax / argmax p


def test_cascades_in_the_loop_greedy(llama_pair):
    """Greedy blocks carry the temperature-1 q under a cascade rule; Chow at alpha 0 is the
    target's greedy output, at alpha 1 every drafted token is kept."""
    from cascade.core.loop import generate
    from cascade.protocol.settings import DraftConfig
    from cascade.protocol.acceptance import AcceptancePolicy
    from models import random_prompts

    target, drafter = llama_pair
    params = SamplingParams(max_new_tokens=16)
    for prompt in random_prompts(2, seed=80):
        plain = generate(target, prompt, params)
        strict = generate(target, prompt, params, drafter, DraftConfig(3),
                          AcceptancePolicy(AcceptanceRule.CHOW, 0.0))
        assert strict.tokens == plain.tokens
        assert strict.stats.num_deferred_tokens > 0
        lenient = generate(target, prompt, params, drafter, DraftConfig(3),
                           AcceptancePolicy(AcceptanceRule.CHOW, 1.0))
        assert lenient.stats.acceptance_rate == 1.0 and lenient.stats.num_deferred_tokens == 0
        assert lenient.stats.tokens_per_target_pass > strict.stats.tokens_per_target_pass

"""Acceptance policies as a table: every rule named in the settings is one function over one
input type, the policy a session names is the one applied, and every lossless rule in the table
emits the target's distribution (a rule that is not lossless must say so to skip that test)."""

import pytest
import torch

from cascade.core.accept.acceptance import ACCEPTANCE_RULES, AcceptanceInput, accept, greedy_accept
from cascade.core.blocks import Draft
from cascade.core.loop import generate
from cascade.core.verify.verification import InvalidDraft, SequenceVerifier
from cascade.protocol.settings import DraftConfig, SamplingParams
from cascade.protocol.acceptance import AcceptancePolicy, AcceptanceRule
from cascade.protocol.wire.convert import acceptance_from_pb, acceptance_to_pb
from models import random_prompts
from distributions import N, VOCAB, assert_matches, random_distribution

SAMPLED = SamplingParams(temperature=1.0)


def test_every_rule_has_exactly_one_function():
    assert set(ACCEPTANCE_RULES) == set(AcceptanceRule)


def _batch(p: torch.Tensor, q: torch.Tensor | None, seed: int) -> tuple[AcceptanceInput, torch.Tensor]:
    """N one-draft rows: drafts from q (uniform when None), target p, random numbers seeded."""
    generator = torch.Generator().manual_seed(seed)
    sampling_q = q if q is not None else torch.full((VOCAB,), 1.0 / VOCAB, dtype=torch.float64)
    drafts = torch.multinomial(sampling_q.float(), N, replacement=True, generator=generator)
    logits = torch.stack([p, torch.full((VOCAB,), 1.0 / VOCAB, dtype=torch.float64)]).log()
    batch = AcceptanceInput(
        draft_tokens=drafts[:, None], num_draft=torch.ones(N, dtype=torch.long),
        target_logits=logits.float().expand(N, 2, VOCAB), sampling=SAMPLED,
        draft_probs=None if q is None else q.double().expand(N, 1, VOCAB),
        u_accept=torch.rand(N, 1, generator=generator, dtype=torch.float64),
        u_sample=torch.rand(N, 2, generator=generator, dtype=torch.float64))
    return batch, drafts


@pytest.mark.parametrize("rule", [r for r in AcceptanceRule
                                  if r.is_lossless and r is not AcceptanceRule.GREEDY])
def test_every_lossless_sampling_rule_in_the_table_emits_p(rule):
    p, q = random_distribution(7, zeros=2), random_distribution(8)
    batch, drafts = _batch(p, None if rule is AcceptanceRule.POINT_MASS else q, seed=3)
    if rule is AcceptanceRule.KEYED:  # each row's positions carry their own Gumbel noise
        uniform = torch.rand(N, 2, VOCAB, generator=torch.Generator().manual_seed(4),
                             dtype=torch.float64).clamp_min(1e-300)
        batch = batch._replace(noise=-(-uniform.log()).log())
    result = accept(rule, batch)
    first = torch.where(result.num_accepted == 1, drafts, result.next_token)
    assert_matches(first, p.float().log().softmax(-1).double())


def test_greedy_rule_is_the_greedy_function():
    logits = torch.randn(4, 3, 11, generator=torch.Generator().manual_seed(0))
    drafts, num_draft = logits.argmax(-1)[:, :2].clone(), torch.tensor([2, 2, 1, 0])
    drafts[1, 1] = (drafts[1, 1] + 1) % 11
    batch = AcceptanceInput(drafts, num_draft, logits, SamplingParams())
    assert [t.tolist() for t in accept(AcceptanceRule.GREEDY, batch)[:2]] == \
        [t.tolist() for t in greedy_accept(drafts, num_draft, logits)[:2]]


def test_the_default_policy_follows_temperature_and_the_draft_settings():
    assert AcceptancePolicy.default_for(SamplingParams()).rule is AcceptanceRule.GREEDY
    assert AcceptancePolicy.default_for(SAMPLED).rule is AcceptanceRule.SPECULATIVE
    no_q = DraftConfig(send_proposal=False)
    assert AcceptancePolicy.default_for(SAMPLED, no_q).rule is AcceptanceRule.POINT_MASS
    with pytest.raises(ValueError, match="needs temperature > 0"):
        AcceptancePolicy(AcceptanceRule.SPECULATIVE).check(SamplingParams())
    with pytest.raises(ValueError, match="alpha"):
        AcceptancePolicy(AcceptanceRule.SPECULATIVE, alpha=1.5)


def test_the_policy_travels_in_session_messages():
    policy = AcceptancePolicy(AcceptanceRule.POINT_MASS)
    assert acceptance_from_pb(acceptance_to_pb(policy), SAMPLED) == policy
    unset = acceptance_to_pb(policy)
    unset.Clear()
    assert acceptance_from_pb(unset, SAMPLED).rule is AcceptanceRule.SPECULATIVE
    with pytest.raises(ValueError, match="temperature 0"):
        acceptance_from_pb(acceptance_to_pb(AcceptancePolicy(AcceptanceRule.GREEDY)), SAMPLED)


def test_a_point_mass_session_refuses_a_proposal_and_is_what_the_loop_runs(gpt2_pair):
    target, drafter = gpt2_pair
    prompt = random_prompts(1, seed=9)[0]
    params = SamplingParams(temperature=0.9, seed=3, max_new_tokens=12)
    point_mass = AcceptancePolicy(AcceptanceRule.POINT_MASS)
    sequence = SequenceVerifier(target, prompt, params, policy=point_mass)
    with pytest.raises(InvalidDraft, match="point_mass"):
        sequence.verify(Draft([1], torch.tensor([[1, 2]]), torch.tensor([[0.5, 0.5]])))
    # a drafter told not to send q gets the point-mass rule; named explicitly it is the same run
    no_q = DraftConfig(3, send_proposal=False)
    implied = generate(target, prompt, params, drafter, no_q)
    named = generate(target, prompt, params, drafter, no_q, policy=point_mass)
    assert implied.tokens == named.tokens and implied.stats == named.stats

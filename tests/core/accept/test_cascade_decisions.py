"""Speculative cascades decide on temperature-1 probabilities when sampling too: the drafter
sends its raw distribution beside the processed q it sampled from, it travels on the wire, and
the verifier's deferral follows it."""

from __future__ import annotations

import pytest
import torch

from cascade.core.blocks import Draft
from cascade.core.proposers import ProposerContext, new_proposer
from cascade.core.verify.verification import SequenceVerifier
from cascade.pod.messages import draft_from_pb, draft_to_pb
from cascade.protocol.settings import DraftConfig, SamplingParams
from cascade.protocol.acceptance import AcceptancePolicy, AcceptanceRule
from models import random_prompts

CHOW = AcceptancePolicy(AcceptanceRule.CHOW, 0.3)  # keeps the drafter's q where max q >= 0.7


def propose(drafter, params, policy, prompt):
    proposer = new_proposer(ProposerContext(drafter, params, DraftConfig(3, max_proposal_tokens=8),
                                            policy))
    return proposer, proposer.propose(prompt, 3)


def test_the_drafter_sends_its_temperature_one_distribution_when_sampling(gpt2_pair):
    _, drafter = gpt2_pair
    prompt = random_prompts(1, seed=31)[0]
    params = SamplingParams(temperature=0.5, seed=3)
    proposer, draft = propose(drafter, params, CHOW, prompt)
    assert draft.decision_ids.shape == draft.q_ids.shape == (3, 8)
    logits = proposer.cache.forward_to(prompt).logits[-1]
    raw = torch.softmax(logits.float(), -1)
    top = raw.topk(8)
    assert torch.equal(draft.decision_ids[0], top.indices)
    renormalised = top.values / top.values.sum()  # the top-K support, as q is sent
    assert torch.allclose(draft.decision_probs[0], renormalised, atol=1e-6)
    assert not torch.allclose(draft.q_probs[0], draft.decision_probs[0])  # q is sharpened
    for same_q in (SamplingParams(temperature=1.0, seed=3), params):
        policy = CHOW if same_q.temperature == 1.0 else AcceptancePolicy(AcceptanceRule.SPECULATIVE)
        _, plain = propose(drafter, same_q, policy, prompt)
        assert plain.decision_ids is None  # temperature 1, or a lossless rule: q is enough


def test_decision_proposals_travel_and_are_checked(gpt2_pair):
    _, drafter = gpt2_pair
    params = SamplingParams(temperature=0.5, seed=3)
    _, draft = propose(drafter, params, CHOW, random_prompts(1, seed=32)[0])
    msg = draft_to_pb(draft, session_id="s", epoch=1, round=0, base_len=4)
    back = draft_from_pb(msg, drafter.vocab_size)
    assert torch.equal(back.decision_ids, draft.decision_ids)
    assert torch.allclose(back.decision_probs, draft.decision_probs)
    del msg.decision_proposals[-1]
    with pytest.raises(ValueError, match="decision_proposals"):
        draft_from_pb(msg, drafter.vocab_size)


def test_deferral_reads_the_temperature_one_distribution(gpt2_pair):
    """q (sharpened by temperature 0.5) is sure of the token, the raw distribution is not:
    Chow at alpha 0.3 defers the position only when it reads the raw one."""
    target, _ = gpt2_pair
    prompt = random_prompts(1, seed=33)[0]
    params = SamplingParams(temperature=0.5, seed=5, max_new_tokens=8)
    ids = torch.tensor([[11, 12]])
    sure, unsure = torch.tensor([[0.95, 0.05]]), torch.tensor([[0.4, 0.3]])
    deferred = []
    for decision in (None, unsure):
        verifier = SequenceVerifier(target, prompt, params, policy=CHOW)
        draft = Draft([11], ids, sure, None if decision is None else ids, decision)
        deferred.append(verifier.verify(draft).num_deferred)
        verifier.close()
    assert deferred == [0, 1]

"""Adaptive draft length: the schedule by hand, exactness, growth and shrinkage with drafters
that always or never agree, the same lengths after a move to a fresh proposer, and the entropy
stop."""

from __future__ import annotations

import random

import pytest

from cascade.core.loop import speculative_rounds
from cascade.core.proposers import ProposerContext, new_proposer
from cascade.core.proposers.schedule import AdaptiveSchedule, adaptive_length
from cascade.core.verify.verification import SequenceVerifier
from cascade.protocol.settings import DraftConfig, SamplingParams
from models import disagreeing_drafter, hf_greedy, random_prompts

T, F = True, False
ADAPTIVE = DraftConfig(num_draft_tokens=3, adaptive=True)  # bounds [1, 6]


@pytest.mark.parametrize("bits, expected", [
    ([], 3),
    ([T, T], 3),              # the first block is not settled yet
    ([T, T, T], 4),           # fully matched: grow
    ([T, T, T, F, T], 4),     # position 3 is the bonus token: no block covers it
    ([T, F], 2),              # early miss: shrink
    ([F] * 10, 1),            # keeps shrinking to the lower bound
    ([T] * 40, 6),            # keeps growing to the upper bound
    ([T, T, T, T, F, T], 3),  # grew to 4, then the block at position 4 missed at once
])
def test_schedule_by_hand(bits, expected):
    assert adaptive_length(bits, 3, *ADAPTIVE.adaptive_bounds) == expected


def test_schedule_fed_bit_by_bit_equals_a_replay():
    rng = random.Random(7)
    bits = [rng.random() < 0.7 for _ in range(300)]
    schedule = AdaptiveSchedule(3, 1, 6)
    for end in range(len(bits) + 1):
        assert schedule.advance(bits[:end]) == adaptive_length(bits[:end], 3, 1, 6)


def drafted_lengths(target, drafter, prompt, config, num_new=24):
    params = SamplingParams(temperature=0.0, max_new_tokens=num_new)
    rounds = list(speculative_rounds(target, prompt, params, drafter, config))
    return [draft.num_tokens for draft, _, _ in rounds], rounds[-1][2].generated


def test_greedy_output_is_exact_and_lengths_follow_the_drafter(gpt2_pair):
    target, drafter = gpt2_pair
    prompt = random_prompts(1, seed=21)[0]
    expected = hf_greedy(target, prompt, 24)
    lengths, output = drafted_lengths(target, drafter, prompt, ADAPTIVE)
    assert output == expected
    always, output = drafted_lengths(target, target, prompt, ADAPTIVE)  # the target drafts
    assert output == expected and always[:4] == [3, 4, 5, 6]
    never, output = drafted_lengths(target, disagreeing_drafter(target), prompt, ADAPTIVE)
    assert output == expected and never[:3] == [3, 2, 1] and set(never[2:-1]) == {1}


def test_a_moved_session_drafts_the_same_lengths(gpt2_pair):
    target, drafter = gpt2_pair
    prompt = random_prompts(1, seed=22)[0]
    params = SamplingParams(temperature=0.0, max_new_tokens=40)
    reference, _ = drafted_lengths(target, drafter, prompt, ADAPTIVE, num_new=40)
    verifier = SequenceVerifier(target, prompt, params)
    lengths = []
    for round_number in range(len(reference)):
        if round_number in (0, 3, 7):  # a fresh drafter takes over the session
            proposer = new_proposer(ProposerContext(drafter, params, ADAPTIVE,
                                                    prompt_len=len(prompt)))
        budget = ADAPTIVE.budget(params, len(verifier.generated))
        draft = proposer.propose(verifier.committed, budget)
        lengths.append(draft.num_tokens)
        verifier.verify(draft)
    assert lengths == reference and verifier.is_finished
    assert len(set(reference)) > 1  # the schedule really moved


def test_max_entropy_ends_blocks(gpt2_pair):
    _, drafter = gpt2_pair
    prompt = random_prompts(1, seed=23)[0]
    low = DraftConfig(num_draft_tokens=6, max_entropy=0.01)
    proposer = new_proposer(ProposerContext(drafter, SamplingParams(), low))
    assert proposer.propose(prompt, 6).num_tokens == 1  # a random tiny model is never that sure
    high = DraftConfig(num_draft_tokens=6, max_entropy=19.0)
    proposer = new_proposer(ProposerContext(drafter, SamplingParams(), high))
    assert proposer.propose(prompt, 6).num_tokens == 6

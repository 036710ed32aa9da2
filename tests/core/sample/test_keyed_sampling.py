"""Position-keyed sampling: the noise is a pure function of (seed, position, token id), the
rule emits exactly the target's distribution (N = 200,000 on adversarial pairs), and what it
emits never depends on the draft: chains, trees and k = 0 give the same tokens."""

import math
import random

import pytest
import torch

from cascade.core.accept.acceptance import keyed_accept
from cascade.core.blocks import Draft
from cascade.core.verify.engine import VerifyEngine
from cascade.core.sample.sampling import (
    STREAM_GUMBEL,
    _splitmix64,
    gumbel_noise,
    keyed_choice,
)
from cascade.protocol.trees import depths
from cascade.core.verify.verification import SequenceVerifier
from cascade.protocol.settings import SamplingParams
from cascade.protocol.acceptance import AcceptancePolicy, AcceptanceRule
from models import tiny_llama
from distributions import ADVERSARIAL, N, VOCAB, assert_matches

KEYED = AcceptancePolicy(AcceptanceRule.KEYED)


def test_the_noise_is_the_documented_hash_of_seed_position_and_token():
    seed, position = 2**63 + 12345, 77
    key = _splitmix64(_splitmix64(_splitmix64(seed) ^ position) ^ STREAM_GUMBEL)
    expected = [-math.log(-math.log(((_splitmix64(key ^ v) >> 11) + 0.5) * 2.0**-53))
                for v in range(50)]
    noise = gumbel_noise(seed, [position], 50)
    torch.testing.assert_close(noise[0], torch.tensor(expected, dtype=torch.float64))
    assert not torch.equal(gumbel_noise(seed, [position + 1], 50)[0], noise[0])


@pytest.mark.parametrize("pair", ADVERSARIAL)
def test_keyed_chains_emit_the_targets_joint_distribution_and_the_k0_tokens(pair):
    """Two positions: the target's second distribution depends on the first token. The drafter
    drafts two tokens coupled to the same noise from its own (adversarial) q."""
    p0, q0 = ADVERSARIAL[pair]
    p1 = torch.stack([p0.roll(a) for a in range(VOCAB)])  # p1[a] after first token a
    q1 = torch.stack([q0.roll(-a) for a in range(VOCAB)])
    noise = gumbel_noise(9, range(2 * N), VOCAB).view(N, 2, VOCAB)
    d0 = keyed_choice(q0.expand(N, VOCAB), noise[:, 0])
    d1 = keyed_choice(q1[d0], noise[:, 1])
    target = torch.stack([p0.expand(N, VOCAB), p1[d0], p0.expand(N, VOCAB)], 1)
    bonus_noise = torch.cat([noise, noise[:, :1]], 1)  # the third position is never read
    result = keyed_accept(torch.stack([d0, d1], 1), torch.full((N,), 2), target, bonus_noise)
    first = torch.where(result.num_accepted >= 1, d0, result.next_token)
    second = torch.where(result.num_accepted == 2, d1,
                         torch.where(result.num_accepted == 1, result.next_token,
                                     keyed_choice(p1[first], noise[:, 1])))
    alone0 = keyed_choice(p0.expand(N, VOCAB), noise[:, 0])
    alone1 = keyed_choice(p1[alone0], noise[:, 1])
    assert torch.equal(first, alone0) and torch.equal(second, alone1)
    assert_matches(first * VOCAB + second, (p0[:, None] * p1).flatten())


def _generate(target, prompt, params, drafts, engine):
    """Rounds with drafts from ``drafts(committed)`` until the generation finishes."""
    sequence = SequenceVerifier(target, prompt, params, policy=KEYED, engine=engine)
    while not sequence.is_finished:
        sequence.verify(drafts(sequence.committed))
    sequence.close()
    return sequence.generated


def test_the_text_depends_on_the_prompt_and_seed_alone():
    target = tiny_llama(0)
    engine = VerifyEngine(target, kv_tokens=1024)
    params = SamplingParams(temperature=0.9, seed=31, max_new_tokens=24)
    prompt = [3, 1, 4, 1, 5]
    alone = _generate(target, prompt, params, lambda committed: Draft([]), engine)
    rng = random.Random(0)

    def random_tree(committed):  # within the KV room left and the depth that fits
        room = params.max_new_tokens - (len(committed) - len(prompt))
        if room < 2:
            return Draft([])
        nodes = rng.randint(1, min(6, room))
        parents = [rng.randint(-1, i - 1) for i in range(nodes)]
        while max(depths(parents)) > room - 1 and nodes > 1:
            parents = [-1] * nodes
        return Draft([rng.randrange(64) for _ in range(nodes)], parents=parents)

    def oracle_chain(committed):  # the tokens decoding alone emits: all accepted
        done = len(committed) - len(prompt)
        return Draft(alone[done: done + 3])

    assert _generate(target, prompt, params, random_tree, engine) == alone
    assert _generate(target, prompt, params, oracle_chain, engine) == alone
    other_seed = SamplingParams(temperature=0.9, seed=32, max_new_tokens=24)
    assert _generate(target, prompt, other_seed, lambda c: Draft([]), engine) != alone

"""Statistical tests: the emitted tokens of the lossless rules are distributed exactly as p.

Only lossless rules belong here (AcceptanceRule.is_lossless); a lossy rule is tested against
its own target distribution instead.

Each test draws N = 200,000 independent trials in one batched call. It checks the total-variation
distance between the empirical distribution and p against 5x the Monte-Carlo noise floor, and a
chi-square goodness-of-fit test (p-value > 0.001); tokens with p = 0 must never appear.
"""

import pytest
import torch

from cascade.core.accept.acceptance import point_mass_accept, speculative_accept
from cascade.core.accept.acceptance_reference import speculative_accept_reference
from cascade.core.sample.sampling import process_logits, sparse_to_dense, sparsify
from cascade.protocol.settings import SamplingParams
from distributions import N, VOCAB, assert_matches, random_distribution

def first_token_samples(p: torch.Tensor, q: torch.Tensor | None, seed: int) -> torch.Tensor:
    """N one-draft rounds with target p [VOCAB] and proposal q [VOCAB] (None: point mass
    on a draft from the uniform distribution); returns the first emitted token of each."""
    generator = torch.Generator().manual_seed(seed)
    sampling_q = q if q is not None else torch.full((VOCAB,), 1.0 / VOCAB)
    drafts = torch.multinomial(sampling_q.float(), N, replacement=True, generator=generator)
    target = torch.stack([p, torch.full((VOCAB,), 1.0 / VOCAB)]).expand(N, 2, VOCAB)
    u_accept = torch.rand(N, 1, generator=generator, dtype=torch.float64)
    u_sample = torch.rand(N, 2, generator=generator, dtype=torch.float64)
    num_draft = torch.ones(N, dtype=torch.long)
    if q is None:
        result = point_mass_accept(drafts[:, None], num_draft, target, u_accept, u_sample)
    else:
        q_rows = q.double().expand(N, 1, VOCAB)
        result = speculative_accept(drafts[:, None], num_draft, target, q_rows, u_accept, u_sample)
    return torch.where(result.num_accepted == 1, drafts, result.next_token)


def one_hot(token: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(token), VOCAB).double()


def truncated(dist: torch.Tensor, keep: int) -> torch.Tensor:
    ids, probs = sparsify(dist.unsqueeze(0), keep)
    return sparse_to_dense(ids, probs, VOCAB)[0]


P_FIXED = torch.tensor([0.4, 0.3, 0.2, 0.1, 0, 0, 0, 0], dtype=torch.float64)
PAIRS = {
    "random_1": (random_distribution(1), random_distribution(2)),
    "random_2": (random_distribution(3, zeros=2), random_distribution(4, zeros=3)),
    "ssd_reference": (P_FIXED, torch.tensor([0.1, 0.4, 0.3, 0.2, 0, 0, 0, 0]).double()),
    "p_equals_q": (random_distribution(5), random_distribution(5)),
    "disjoint_supports": (P_FIXED, torch.tensor([0, 0, 0, 0, 0.25, 0.25, 0.25, 0.25]).double()),
    "one_hot_q": (random_distribution(6), one_hot(2)),
    "q_zero_where_p_positive": (random_distribution(7), random_distribution(8, zeros=4)),
    "truncated_sparse_q": (random_distribution(9), truncated(random_distribution(10), keep=3)),
}


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_speculative_sampling_matches_target(name):
    p, q = PAIRS[name]
    assert_matches(first_token_samples(p, q, seed=11), p)


@pytest.mark.parametrize("name", ["random_1", "one_hot_q", "q_zero_where_p_positive"])
def test_point_mass_matches_target(name):
    p, _ = PAIRS[name]
    assert_matches(first_token_samples(p, None, seed=12), p)


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 0, 1.0), (1.3, 0, 0.8), (1.0, 5, 0.9)])
def test_processed_distributions_match(temperature, top_k, top_p):
    """p and q go through the same temperature / top-k / top-p processing."""
    generator = torch.Generator().manual_seed(13)
    logits = torch.randn(2, VOCAB, generator=generator) * 2
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    p, q = process_logits(logits, params).double()
    assert_matches(first_token_samples(p, q, seed=14), p)


def test_naive_emission_is_detected():
    """The check has power: emitting accepted drafts without the residual correction fails."""
    p, q = PAIRS["random_1"]
    generator = torch.Generator().manual_seed(15)
    drafts = torch.multinomial(q.float(), N, replacement=True, generator=generator)
    with pytest.raises(AssertionError):
        assert_matches(drafts, p)


# Joint two-position test: p2 and q2 depend on the first token, as they would in a real model.
P1, Q1 = random_distribution(20), random_distribution(21)
P2 = torch.stack([random_distribution(30 + x) for x in range(VOCAB)])  # [VOCAB (x1), VOCAB]
Q2 = torch.stack([random_distribution(50 + x, zeros=2) for x in range(VOCAB)])


def test_two_position_joint_distribution():
    generator = torch.Generator().manual_seed(22)
    d1 = torch.multinomial(Q1.float(), N, replacement=True, generator=generator)
    d2 = torch.multinomial(Q2[d1].float(), 1, generator=generator).squeeze(1)
    target = torch.stack([P1.expand(N, VOCAB), P2[d1], P1.expand(N, VOCAB)], dim=1)
    proposal = torch.stack([Q1.expand(N, VOCAB), Q2[d1]], dim=1)
    result = speculative_accept(
        torch.stack([d1, d2], 1), torch.full((N,), 2), target, proposal,
        torch.rand(N, 2, generator=generator, dtype=torch.float64),
        torch.rand(N, 3, generator=generator, dtype=torch.float64),
    )
    n, nxt = result.num_accepted, result.next_token
    x1 = torch.where(n >= 1, d1, nxt)
    # Rows rejected at position 1 continue with a fresh one-draft round in context x1.
    redraft = torch.multinomial(Q2[x1].float(), 1, generator=generator).squeeze(1)
    second = speculative_accept(
        redraft[:, None], torch.ones(N, dtype=torch.long),
        torch.stack([P2[x1], P1.expand(N, VOCAB)], 1), Q2[x1].unsqueeze(1),
        torch.rand(N, 1, generator=generator, dtype=torch.float64),
        torch.rand(N, 2, generator=generator, dtype=torch.float64),
    )
    x2_new_round = torch.where(second.num_accepted == 1, redraft, second.next_token)
    x2 = torch.where(n == 2, d2, torch.where(n == 1, nxt, x2_new_round))
    joint = (P1.unsqueeze(1) * P2).flatten()  # [VOCAB * VOCAB]
    assert_matches(x1 * VOCAB + x2, joint)


def test_fast_path_agrees_with_reference_on_same_random_numbers():
    generator = torch.Generator().manual_seed(23)
    batch, k = 300, 4
    p = torch.softmax(torch.randn(batch, k + 1, VOCAB, generator=generator) * 2, -1).double()
    q = torch.softmax(torch.randn(batch, k, VOCAB, generator=generator) * 2, -1).double()
    drafts = torch.multinomial(q.reshape(-1, VOCAB).float(), 1, generator=generator)
    drafts = drafts.reshape(batch, k)
    num_draft = torch.randint(0, k + 1, (batch,), generator=generator)
    u_accept = torch.rand(batch, k, generator=generator, dtype=torch.float64)
    u_sample = torch.rand(batch, k + 1, generator=generator, dtype=torch.float64)
    fast = speculative_accept(drafts, num_draft, p, q, u_accept, u_sample)
    for b in range(batch):
        m = int(num_draft[b])
        expected = speculative_accept_reference(
            drafts[b, :m].tolist(), p[b, : m + 1], q[b, :m], u_accept[b].tolist(),
            u_sample[b].tolist(),
        )
        assert (int(fast.num_accepted[b]), int(fast.next_token[b])) == expected

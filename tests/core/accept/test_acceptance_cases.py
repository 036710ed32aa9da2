"""Hand-computed acceptance cases, in the style of vLLM's rejection sampler tests."""

import pytest
import torch

from cascade.core.accept.acceptance import greedy_accept, point_mass_accept, speculative_accept
from cascade.core.accept.acceptance_reference import greedy_accept_reference, speculative_accept_reference

VOCAB = 6


def peaked_logits(argmaxes: list[int]) -> torch.Tensor:
    """[len, VOCAB] logits whose argmax at row i is argmaxes[i]."""
    logits = torch.zeros(len(argmaxes), VOCAB)
    logits[torch.arange(len(argmaxes)), argmaxes] = 10.0
    return logits


# (drafted tokens, target argmax per position (k+1), expected accepted, expected next token)
GREEDY_CASES = [
    ([1, 2, 3], [1, 2, 3, 4], 3, 4),  # all accepted -> bonus
    ([1, 2, 3], [5, 2, 3, 4], 0, 5),  # first rejected -> recovered
    ([1, 2, 3], [1, 5, 3, 4], 1, 5),  # mismatch in the middle
    ([1, 2, 3], [1, 2, 0, 4], 2, 0),  # mismatch at the last draft
    ([4], [4, 2], 1, 2),  # k = 1 accepted
    ([4], [3, 2], 0, 3),  # k = 1 rejected
    ([], [3], 0, 3),  # k = 0: plain decoding
]


@pytest.mark.parametrize("draft,argmaxes,num_accepted,next_token", GREEDY_CASES)
def test_greedy_cases(draft, argmaxes, num_accepted, next_token):
    logits = peaked_logits(argmaxes)
    tokens = torch.tensor([draft], dtype=torch.long).reshape(1, len(draft))
    result = greedy_accept(tokens, torch.tensor([len(draft)]), logits.unsqueeze(0))
    assert (int(result.num_accepted), int(result.next_token)) == (num_accepted, next_token)
    assert greedy_accept_reference(draft, logits) == (num_accepted, next_token)


def test_greedy_batch_with_ragged_drafts():
    tokens = torch.tensor([[1, 2, 3], [1, 2, -1], [0, -1, -1]])
    logits = torch.stack([peaked_logits([1, 2, 3, 4]), peaked_logits([1, 2, 3, 4]),
                          peaked_logits([5, 1, 1, 1])])
    result = greedy_accept(tokens, torch.tensor([3, 2, 1]), logits)
    assert result.num_accepted.tolist() == [3, 2, 0]
    assert result.next_token.tolist() == [4, 3, 5]  # row 1: bonus at its own position 2


def one_hot(token: int) -> torch.Tensor:
    row = torch.zeros(VOCAB, dtype=torch.float64)
    row[token] = 1.0
    return row


# Temperature > 0: p and q chosen so min(1, p/q) and the residual are easy to compute by hand.
# p rows, q rows, uniforms for acceptance, expected accepted, expected next token.
P_HALF = torch.tensor([0.5, 0.5, 0, 0, 0, 0], dtype=torch.float64)
Q_SKEW = torch.tensor([0.25, 0.75, 0, 0, 0, 0], dtype=torch.float64)
SAMPLING_CASES = [
    # draft token 1: p/q = 0.5/0.75 = 2/3. u=0.5 accepts; u=0.9 rejects -> residual = token 0.
    ("accepted then bonus", [1], [P_HALF, one_hot(3)], [Q_SKEW], [0.5], 1, 3),
    ("first rejected", [1], [P_HALF, one_hot(3)], [Q_SKEW], [0.9], 0, 0),
    # draft token 0: p/q = 2 >= 1 always accepted; then token 1 rejected at u=0.7 -> token 0.
    ("mismatch in the middle", [0, 1, 2], [P_HALF, P_HALF, one_hot(2), one_hot(4)],
     [Q_SKEW, Q_SKEW, one_hot(2)], [0.99, 0.7, 0.0], 1, 0),
    ("p = q accepts all", [2, 3], [one_hot(2), one_hot(3), one_hot(5)],
     [one_hot(2), one_hot(3)], [0.999, 0.999], 2, 5),
    ("p(d) = 0 always rejects", [4], [P_HALF, one_hot(1)], [one_hot(4)], [0.0], 0, 0),
]


@pytest.mark.parametrize(
    "name,draft,p_rows,q_rows,u_accept,num_accepted,next_token",
    SAMPLING_CASES, ids=[c[0] for c in SAMPLING_CASES],
)
def test_speculative_cases(name, draft, p_rows, q_rows, u_accept, num_accepted, next_token):
    k = len(draft)
    p, q = torch.stack(p_rows), torch.stack(q_rows)
    u_sample = [0.3] * (k + 1)
    result = speculative_accept(
        torch.tensor([draft]), torch.tensor([k]), p.unsqueeze(0), q.unsqueeze(0),
        torch.tensor([u_accept], dtype=torch.float64), torch.tensor([u_sample], dtype=torch.float64),
    )
    assert (int(result.num_accepted), int(result.next_token)) == (num_accepted, next_token)
    reference = speculative_accept_reference(draft, p, q, u_accept, u_sample)
    assert reference == (num_accepted, next_token)


def test_point_mass_rejection_removes_drafted_token():
    # p = [0.5, 0.5]; the drafted token 0 is accepted with probability 0.5.
    p = torch.stack([P_HALF, one_hot(3)]).unsqueeze(0)
    draft = torch.tensor([[0]])
    rejected = point_mass_accept(draft, torch.tensor([1]), p, torch.tensor([[0.6]]).double(),
                                 torch.tensor([[0.0, 0.0]]).double())
    assert (int(rejected.num_accepted), int(rejected.next_token)) == (0, 1)
    accepted = point_mass_accept(draft, torch.tensor([1]), p, torch.tensor([[0.4]]).double(),
                                 torch.tensor([[0.0, 0.0]]).double())
    assert (int(accepted.num_accepted), int(accepted.next_token)) == (1, 3)

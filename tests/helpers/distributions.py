"""Statistical checks the distribution tests share: a batch of samples against a target
distribution (total-variation distance against the Monte-Carlo noise floor, and chi-square), the
random and adversarial (target, drafter) pairs they draw from."""

import math

import torch
from scipy.stats import chisquare

N = 200_000
VOCAB = 8


def assert_matches(samples: torch.Tensor, p: torch.Tensor) -> None:
    """samples: [N] token ids (or flattened cells); p: [cells] target distribution."""
    p = p.double() / p.sum()
    counts = torch.bincount(samples, minlength=p.numel()).double()
    empirical = counts / counts.sum()
    assert counts[p == 0].sum() == 0, "a token with target probability 0 was emitted"
    noise_floor = 0.5 * torch.sqrt(2 * p * (1 - p) / (math.pi * counts.sum())).sum()
    tv = 0.5 * (empirical - p).abs().sum()
    assert tv < 5 * noise_floor, f"TV {tv:.5f} above 5x noise floor {noise_floor:.5f}"
    support = p > 0
    if int(support.sum()) > 1:
        result = chisquare(counts[support].numpy(), (p[support] * counts.sum()).numpy())
        assert result.pvalue > 1e-3, f"chi-square p-value {result.pvalue:.2e}"


def random_distribution(seed: int, zeros: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    dist = torch.rand(VOCAB, generator=generator, dtype=torch.float64) ** 2
    dist[torch.randperm(VOCAB, generator=generator)[:zeros]] = 0.0
    return dist / dist.sum()


ADVERSARIAL = {  # (target p, drafter q) over VOCAB tokens
    "random": (random_distribution(1), random_distribution(2)),
    "disjoint": (torch.tensor([0.5, 0.5, 0, 0, 0, 0, 0, 0]).double(),
                 torch.tensor([0, 0, 0.5, 0.5, 0, 0, 0, 0]).double()),
    "q_sharper": (random_distribution(3), torch.nn.functional.one_hot(torch.tensor(5),
                                                                      VOCAB).double()),
    "sparse": (random_distribution(4, zeros=4), random_distribution(5, zeros=2)),
}

"""Sampling: logit processing, sparse proposals, and seeded per-position randomness.

The same processing (temperature, then top-k, then top-p) is applied to the target's logits
(giving p) and to the drafter's logits (giving q); speculative sampling is exact for any q as long
as the drafter samples from exactly the q the verifier sees.

Randomness is a pure function of ``(seed, position, stream)``: every token position of a session
owns a few uniforms, one per stream, so a session that is replayed (or moved to another pod) at a
round boundary draws the same numbers. Sampling uses the inverse CDF with one uniform, so each
draw consumes exactly one number.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from cascade.protocol.settings import SamplingParams

STREAM_DRAFT = 0
"""Uniform the drafter uses to sample its proposal at a position."""
STREAM_ACCEPT = 1
"""Uniform the verifier compares with p/q to accept a drafted token."""
STREAM_SAMPLE = 2
"""Uniform the verifier uses to sample the recovered or bonus token."""
STREAM_GUMBEL = 3
"""Key of the per-token Gumbel noise of a position (position-keyed sampling)."""
STREAM_SIBLING_ACCEPT = 64
"""Streams 64 + j: the uniform deciding the j-th child tried at a position (recursive rule)."""
STREAM_CHILD_DRAFT = 192
"""Streams 192 + j: the uniform the drafter samples a node's j-th child with (recursive rule)."""

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _position_key(seed: int, position: int, stream: int) -> int:
    """A 64-bit word that depends only on (seed, position, stream)."""
    return _splitmix64(_splitmix64(_splitmix64(seed & _MASK64) ^ position) ^ stream)


def position_uniform(seed: int, position: int, stream: int) -> float:
    """A uniform in [0, 1) that depends only on (seed, position, stream)."""
    return (_position_key(seed, position, stream) >> 11) * 2.0**-53


def _signed(x: int) -> int:
    return x - (1 << 64) if x >= 1 << 63 else x


_GAMMA, _MIX1, _MIX2 = (_signed(c) for c in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9,
                                            0x94D049BB133111EB))


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 values holding unsigned 64-bit words."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _splitmix64_tensor(x: torch.Tensor) -> torch.Tensor:
    """``_splitmix64`` on int64 tensors (two's-complement wrap-around stands for mod 2**64)."""
    x = x + _GAMMA
    x = (x ^ _shift_right(x, 30)) * _MIX1
    x = (x ^ _shift_right(x, 27)) * _MIX2
    return x ^ _shift_right(x, 31)


def gumbel_noise(seed: int, positions: Sequence[int], vocab_size: int) -> torch.Tensor:
    """Gumbel(0, 1) noise [len(positions), vocab] float64 that depends only on (seed, position,
    token id): token v at position t gets -log(-log(u)) with u a pure function of the three.

    Position-keyed sampling draws the token at position t as argmax(log p + noise[t]) (the
    Gumbel-max trick: exactly a sample of p), so the token emitted at a position depends on the
    seed and the tokens before it alone, never on what was drafted."""
    keys = torch.tensor([_signed(_position_key(seed, t, STREAM_GUMBEL)) for t in positions],
                        dtype=torch.long)
    ids = torch.arange(vocab_size, dtype=torch.long)
    words = _splitmix64_tensor(keys[:, None] ^ ids[None, :])  # [n, vocab]
    uniforms = (_shift_right(words, 11).double() + 0.5) * 2.0**-53  # in (0, 1)
    return -torch.log(-torch.log(uniforms))


class KeyedNoise:
    """One sequence's ``gumbel_noise`` rows by position, kept until ``forget_before`` moves past
    them: positions a rejection left undecided are read again next round, by the verifier and
    by a drafter drafting keyed choices, without recomputing their noise."""

    def __init__(self, seed: int, vocab_size: int) -> None:
        self.seed, self.vocab_size = seed, vocab_size
        self._rows: dict[int, torch.Tensor] = {}

    def forget_before(self, position: int) -> None:
        for old in [p for p in self._rows if p < position]:
            del self._rows[old]

    def rows(self, positions: Sequence[int]) -> torch.Tensor:
        """[len(positions), vocab] float64."""
        missing = [p for p in positions if p not in self._rows]
        if missing:
            self._rows.update(zip(missing, gumbel_noise(self.seed, missing, self.vocab_size)))
        return torch.stack([self._rows[p] for p in positions])


def keyed_choice(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """argmax(log probs + noise) over the last dimension (a token outside the support, with
    probability 0, is never chosen)."""
    return (probs.double().log() + noise).argmax(dim=-1)


def position_uniforms(seed: int, start: int, count: int, stream: int) -> torch.Tensor:
    """Uniforms for positions ``start .. start+count-1``.  # [count] float64"""
    values = [position_uniform(seed, start + i, stream) for i in range(count)]
    return torch.tensor(values, dtype=torch.float64)


class RowSampling(NamedTuple):
    """Sampling settings per row, as tensors: one batch mixes sessions with different settings
    (as vLLM's sampler does)."""

    temperature: torch.Tensor
    """[B] float32 (0 = greedy)."""
    top_k: torch.Tensor
    """[B] int64 (0 = off)."""
    top_p: torch.Tensor
    """[B] float32 (1 = off)."""

    @classmethod
    def of(cls, params: list[SamplingParams]) -> RowSampling:
        return cls(torch.tensor([p.temperature for p in params], dtype=torch.float32),
                   torch.tensor([p.top_k for p in params], dtype=torch.long),
                   torch.tensor([p.top_p for p in params], dtype=torch.float32))

    @property
    def is_greedy(self) -> bool:
        """Every row greedy (a batch never mixes greedy and sampled rows in one rule call)."""
        return bool((self.temperature == 0).all())


def process_logits(logits: torch.Tensor, params: SamplingParams | RowSampling) -> torch.Tensor:
    """Temperature, top-k and top-p applied to logits; returns probabilities.

    logits: [..., vocab] ([B, ...] with ``RowSampling``, one setting per leading row). Returns
    float32 probabilities of the same shape that sum to 1 over the kept tokens. Requires
    temperature > 0 (greedy decoding never needs probabilities).
    """
    if isinstance(params, RowSampling):
        return _process_rows(logits, params)
    assert params.temperature > 0, "greedy decoding works on logits, not probabilities"
    scaled = logits.float() / params.temperature
    if 0 < params.top_k < scaled.shape[-1]:
        kth = scaled.topk(params.top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if params.top_p < 1.0:
        probs = _apply_top_p(probs, params.top_p)
    return probs


def _process_rows(logits: torch.Tensor, rows: RowSampling) -> torch.Tensor:
    """``process_logits`` with per-row settings; each row gets what its own settings give."""
    assert bool((rows.temperature > 0).all()), "greedy rows work on logits, not probabilities"
    per_row = (-1,) + (1,) * (logits.dim() - 1)  # broadcast [B] over the other dimensions
    scaled = logits.float() / rows.temperature.view(per_row)
    vocab = scaled.shape[-1]
    active = (rows.top_k > 0) & (rows.top_k < vocab)
    if bool(active.any()):
        widest = int(rows.top_k[active].max())
        top = scaled.topk(widest, dim=-1).values
        index = (rows.top_k.clamp(1, widest) - 1).view(per_row).expand(*top.shape[:-1], 1)
        kth = torch.where(active.view(per_row), top.gather(-1, index), float("-inf"))
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    nucleus = rows.top_p < 1.0
    if bool(nucleus.any()):
        kept = _apply_top_p(probs, rows.top_p.view(per_row))
        probs = torch.where(nucleus.view(per_row), kept, probs)
    return probs


def _apply_top_p(probs: torch.Tensor, top_p: float | torch.Tensor) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill(mass_before >= top_p, 0.0)
    kept = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return kept / kept.sum(dim=-1, keepdim=True)


def sparsify(probs: torch.Tensor, max_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The top ``max_tokens`` entries of each row, renormalised.

    probs: [n, vocab]. Returns ids [n, K] int64 and probs [n, K] float32 (K = min(max_tokens,
    vocab)), most likely first; entries outside the support carry probability 0. The float32
    values are what travels on the wire, so they are the proposal the drafter samples from.
    """
    values, ids = probs.topk(min(max_tokens, probs.shape[-1]), dim=-1)
    values = values.float()
    return ids, values / values.sum(dim=-1, keepdim=True)


def sparse_to_dense(ids: torch.Tensor, probs: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Dense float64 proposal rows from sparse ones, normalised the way sampling sees them.

    ids, probs: [n, K]. Returns [n, vocab]. Both the drafter (to sample) and the verifier (to
    accept) use this normalisation, so they agree on q to float64 precision.
    """
    dense = torch.zeros(ids.shape[0], vocab_size, dtype=torch.float64)
    dense.scatter_add_(-1, ids, probs.double())
    return dense / dense.sum(dim=-1, keepdim=True)


def sample_from(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: one token per row from unnormalised probabilities.

    probs: [n, m] (non-negative, each row with positive mass); uniforms: [n] in [0, 1).
    Returns column indices [n]. A zero-probability column is never returned.
    """
    cdf = probs.double().cumsum(dim=-1)
    targets = (uniforms.double() * cdf[:, -1]).unsqueeze(-1)
    index = torch.searchsorted(cdf, targets, right=True).squeeze(-1)
    return index.clamp(max=probs.shape[-1] - 1)

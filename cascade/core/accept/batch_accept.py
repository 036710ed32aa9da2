"""Acceptance for a batch of rows from different sessions, in as few rule calls as possible.

Rows that share a rule, its alpha, whether a proposal q came with the block and whether they are
greedy go into one ``AcceptanceInput``: drafts padded to the group's longest (``num_draft`` says
how many are real, so padding is never accepted and the bonus position is each row's own),
sampling settings per row (``RowSampling``). Padding is chosen so that every padded value is a
valid input (uniform target rows, a point mass for q), though no rule reads it.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from cascade.core.accept.acceptance import AcceptanceInput, accept
from cascade.core.sample.sampling import RowSampling
from cascade.protocol.settings import SamplingParams
from cascade.protocol.acceptance import AcceptancePolicy


class AcceptRow(NamedTuple):
    """One session's part of a batched acceptance."""

    policy: AcceptancePolicy
    sampling: SamplingParams
    draft_tokens: list[int]
    target_logits: torch.Tensor
    """[k+1, vocab] float32."""
    draft_probs: torch.Tensor | None
    """[k, vocab] dense q, or None."""
    u_accept: torch.Tensor
    """[k] float64."""
    u_sample: torch.Tensor
    """[k+1] float64."""
    decision_probs: torch.Tensor | None = None
    """Cascade rules when sampling: [k, vocab] the drafter's temperature-1 q the rule decides
    on (None: it decides on draft_probs)."""
    noise: torch.Tensor | None = None
    """The keyed rule: [k+1, vocab] float64 Gumbel noise of each position."""


class RowResult(NamedTuple):
    num_accepted: int
    next_token: int
    num_deferred: int
    path: tuple[int, ...] | None = None
    """A tree's accepted node indices (None: a chain's first num_accepted)."""


def accept_rows(rows: list[AcceptRow]) -> list[RowResult]:
    """Each row's acceptance, batched by rule."""
    groups: dict[tuple, list[int]] = {}
    for i, row in enumerate(rows):
        key = (row.policy.rule, row.policy.alpha, row.draft_probs is None,
               row.sampling.is_greedy, row.decision_probs is None)
        groups.setdefault(key, []).append(i)
    results: list[RowResult | None] = [None] * len(rows)
    for members in groups.values():
        picked = [rows[i] for i in members]
        result = accept(picked[0].policy.rule, _collate(picked))
        deferred = result.num_deferred
        for j, i in enumerate(members):
            results[i] = RowResult(int(result.num_accepted[j]), int(result.next_token[j]),
                                   0 if deferred is None else int(deferred[j]))
    return results


def _collate(rows: list[AcceptRow]) -> AcceptanceInput:
    widest = max(len(r.draft_tokens) for r in rows)
    vocab = rows[0].target_logits.shape[-1]
    tokens = torch.zeros(len(rows), widest, dtype=torch.long)
    logits = torch.zeros(len(rows), widest + 1, vocab)
    u_accept = torch.full((len(rows), widest), 0.5, dtype=torch.float64)
    u_sample = torch.full((len(rows), widest + 1), 0.5, dtype=torch.float64)
    q = None if rows[0].draft_probs is None else _point_masses(len(rows), widest, vocab)
    decision = (None if rows[0].decision_probs is None
                else _point_masses(len(rows), widest, vocab))
    noise = (None if rows[0].noise is None
             else torch.zeros(len(rows), widest + 1, vocab, dtype=torch.float64))
    for i, r in enumerate(rows):
        k = len(r.draft_tokens)
        tokens[i, :k] = torch.tensor(r.draft_tokens, dtype=torch.long)
        logits[i, : k + 1] = r.target_logits
        u_accept[i, :k], u_sample[i, : k + 1] = r.u_accept, r.u_sample
        if q is not None:
            q[i, :k] = r.draft_probs
        if decision is not None:
            decision[i, :k] = r.decision_probs
        if noise is not None:
            noise[i, : k + 1] = r.noise
    sampling = RowSampling.of([r.sampling for r in rows])
    return AcceptanceInput(tokens, torch.tensor([len(r.draft_tokens) for r in rows]), logits,
                           sampling, q, u_accept, u_sample, rows[0].policy.alpha,
                           decision_probs=decision, noise=noise)


def _point_masses(count: int, width: int, vocab: int) -> torch.Tensor:
    q = torch.zeros(count, width, vocab, dtype=torch.float64)
    q[..., 0] = 1.0  # padded drafts are token 0, drawn from a point mass on it
    return q


def guarded(function, *args):
    """``function(*args)``, or the exception it raised (one row's fault, kept to its row)."""
    try:
        return function(*args)
    except Exception as exc:  # noqa: BLE001 - handed to the row's caller, which raises it
        return exc


def accept_chains(rows: dict[int, object]) -> dict[int, object]:
    """Each chain row's acceptance (``accept_rows``, batched by rule), by row; a row whose
    ``acceptance_row`` raised keeps its exception. Should the batched call raise, each row is
    decided alone, so only the row at fault fails."""
    good = [j for j, row in rows.items() if not isinstance(row, Exception)]
    decided = {j: row for j, row in rows.items() if isinstance(row, Exception)}
    try:
        decided.update(zip(good, accept_rows([rows[j] for j in good])))
    except Exception:  # noqa: BLE001 - found again row by row below
        decided.update({j: guarded(lambda row: accept_rows([row])[0], rows[j]) for j in good})
    return decided

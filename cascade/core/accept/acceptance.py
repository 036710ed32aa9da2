"""Acceptance rules: pure tensor functions that decide what a verifier keeps from a draft.

Vocabulary (as in vLLM's rejection sampler and arXiv 2211.17192 / 2302.01318):

- **drafted tokens** d_1..d_k: what the drafter proposed for one round.
- **accepted tokens**: the longest prefix of the draft the rule keeps.
- **recovered token**: after the first rejection at position i, a token drawn from the residual
  norm(max(0, p_i - q_i)) (greedy: argmax p_i). It replaces d_i.
- **bonus token**: when all k are accepted, a token drawn from p_{k+1}, the target's next
  distribution, which the same forward pass already computed.
- Every round emits ``num_accepted + 1`` tokens: accepted tokens plus one recovered or bonus token.
- **acceptance rate** = accepted tokens / drafted tokens.
- **mean acceptance length** = 1 + accepted tokens / rounds (bonus included, vLLM's definition).

Shapes: a batch of B sessions with up to k drafted tokens each. Rows with fewer drafts are padded
(any token id) and say how many are real in ``num_draft``; a padded position is never accepted, and
the token emitted right after the real drafts is the bonus token.

Randomness is passed in: ``u_accept[b, i]`` decides position i and ``u_sample[b, i]`` draws the
recovered or bonus token at position i (inverse CDF). Each function returns ``AcceptResult`` tensors;
the caller makes the round's single host sync when it serialises them.

Policies: ``ACCEPTANCE_RULES`` maps each ``AcceptanceRule`` to one function over one input type,
``AcceptanceInput``; ``accept(rule, batch)`` is the only dispatch. Greedy, speculative,
point-mass and keyed are lossless (keyed: the target's choice at each position is the Gumbel-max
of p under noise keyed by seed and position, so the emitted text never depends on the draft, and
it also verifies token trees, ``cascade.core.accept.tree_accept``); the speculative-cascade rules (cascade.core.accept.cascades) are lossy by
design and also count the positions they deferred to the target.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

from cascade.protocol.settings import SamplingParams

from cascade.protocol.acceptance import AcceptanceRule

from cascade.core.accept.cascades import cascade_target
from cascade.core.sample.sampling import RowSampling, keyed_choice, process_logits, sample_from


class AcceptResult(NamedTuple):
    num_accepted: torch.Tensor
    """[B] int64: accepted drafted tokens per row."""
    next_token: torch.Tensor
    """[B] int64: the recovered token (after a rejection) or the bonus token (all accepted)."""
    num_deferred: torch.Tensor | None = None
    """[B] int64, cascade rules only: verified positions (the accepted ones and the one that
    decided the next token) whose target was the verifier's."""


def _valid_mask(num_draft: torch.Tensor, k: int) -> torch.Tensor:
    return torch.arange(k).unsqueeze(0) < num_draft.unsqueeze(1)  # [B, k]


def _count_accepted(accept: torch.Tensor) -> torch.Tensor:
    return accept.int().cumprod(dim=-1).sum(dim=-1).long()  # [B]


def greedy_accept(
    draft_tokens: torch.Tensor,  # [B, k] int64
    num_draft: torch.Tensor,  # [B] int64
    target_logits: torch.Tensor,  # [B, k+1, vocab]
) -> AcceptResult:
    """Keep drafted tokens while each equals the target's argmax; then emit the argmax."""
    batch, k = draft_tokens.shape
    assert target_logits.shape[:2] == (batch, k + 1), "target logits must cover k+1 positions"
    target_argmax = target_logits.argmax(dim=-1)  # [B, k+1]
    accept = (draft_tokens == target_argmax[:, :k]) & _valid_mask(num_draft, k)
    num_accepted = _count_accepted(accept)
    next_token = target_argmax.gather(1, num_accepted.unsqueeze(1)).squeeze(1)
    return AcceptResult(num_accepted, next_token)


def speculative_accept(
    draft_tokens: torch.Tensor,  # [B, k] int64
    num_draft: torch.Tensor,  # [B] int64
    target_probs: torch.Tensor,  # [B, k+1, vocab], processed p
    draft_probs: torch.Tensor,  # [B, k, vocab], the proposal q each token was sampled from
    u_accept: torch.Tensor,  # [B, k] float64 in [0, 1)
    u_sample: torch.Tensor,  # [B, k+1] float64 in [0, 1)
) -> AcceptResult:
    """Speculative sampling: accept d_i with probability min(1, p_i(d_i) / q_i(d_i)).

    On the first rejection emit a token from norm(max(0, p_i - q_i)); if all are accepted emit a
    bonus token from p_{k+1}. The emitted tokens are distributed exactly as p, for any q.
    """
    batch, k = draft_tokens.shape
    assert target_probs.shape[:2] == (batch, k + 1), "target probs must cover k+1 positions"
    assert draft_probs.shape[:2] == (batch, k), "one proposal row per drafted token"
    valid = _valid_mask(num_draft, k)
    safe_tokens = draft_tokens.clamp_min(0).unsqueeze(-1)  # [B, k, 1]
    p_drafted = target_probs[:, :k].gather(-1, safe_tokens).squeeze(-1).double()  # [B, k]
    q_drafted = draft_probs.gather(-1, safe_tokens).squeeze(-1).double()  # [B, k]
    accept = (u_accept * q_drafted < p_drafted) & valid  # u < p/q without dividing by q
    num_accepted = _count_accepted(accept)
    rows = torch.arange(batch)
    p_next = target_probs[rows, num_accepted].double()  # [B, vocab]
    q_next = F.pad(draft_probs, (0, 0, 0, 1))[rows, num_accepted].double()  # [B, vocab]
    is_bonus = (num_accepted >= num_draft).unsqueeze(-1)  # past the real drafts q is absent
    residual = torch.where(is_bonus, p_next, (p_next - q_next).clamp_min(0.0))
    # If p <= q everywhere (only float rounding can reject then), fall back to p itself.
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_next)
    next_token = sample_from(residual, u_sample[rows, num_accepted])
    return AcceptResult(num_accepted, next_token)


def point_mass_accept(
    draft_tokens: torch.Tensor,  # [B, k] int64
    num_draft: torch.Tensor,  # [B] int64
    target_probs: torch.Tensor,  # [B, k+1, vocab]
    u_accept: torch.Tensor,  # [B, k] float64
    u_sample: torch.Tensor,  # [B, k+1] float64
) -> AcceptResult:
    """Speculative sampling when the drafter sends no q: q_i is a point mass on d_i.

    Accepts d_i with probability p_i(d_i); the residual is p_i with d_i removed.
    """
    vocab = target_probs.shape[-1]
    point_mass = F.one_hot(draft_tokens.clamp_min(0), vocab).double()  # [B, k, vocab]
    return speculative_accept(
        draft_tokens, num_draft, target_probs, point_mass, u_accept, u_sample
    )


def keyed_accept(
    draft_tokens: torch.Tensor,  # [B, k] int64
    num_draft: torch.Tensor,  # [B] int64
    target_probs: torch.Tensor,  # [B, k+1, vocab], processed p
    noise: torch.Tensor,  # [B, k+1, vocab] float64 Gumbel noise of each position
) -> AcceptResult:
    """Position-keyed sampling: the target's choice at each position is argmax(log p +
    noise); keep drafted tokens while they equal it, then emit the choice after them."""
    k = draft_tokens.shape[1]
    choices = keyed_choice(target_probs, noise)  # [B, k+1]
    accept = (draft_tokens == choices[:, :k]) & _valid_mask(num_draft, k)
    num_accepted = _count_accepted(accept)
    return AcceptResult(num_accepted, choices.gather(1, num_accepted.unsqueeze(1)).squeeze(1))


class AcceptanceInput(NamedTuple):
    """The one input every acceptance rule takes: a batch of drafts and the target's view."""

    draft_tokens: torch.Tensor
    """[B, k] int64 (rows with fewer drafts padded; see num_draft)."""
    num_draft: torch.Tensor
    """[B] int64 real drafted tokens per row."""
    target_logits: torch.Tensor
    """[B, k+1, vocab] float32 raw logits for the last committed token and each drafted one."""
    sampling: SamplingParams | RowSampling
    """Temperature, top-k and top-p applied to the logits (giving p): one setting for the batch,
    or one per row."""
    draft_probs: torch.Tensor | None = None
    """[B, k, vocab] the proposal q each token was sampled from; None: no q was sent."""
    u_accept: torch.Tensor | None = None
    """[B, k] float64 uniforms deciding each position (unused by greedy)."""
    u_sample: torch.Tensor | None = None
    """[B, k+1] float64 uniforms drawing the recovered or bonus token (unused by greedy)."""
    alpha: float = 0.0
    """The policy's knob (lossy rules)."""
    decision_probs: torch.Tensor | None = None
    """[B, k, vocab] the drafter's temperature-1 q, which cascade rules decide on; None: they
    decide on draft_probs."""
    noise: torch.Tensor | None = None
    """[B, k+1, vocab] float64 Gumbel noise of each position (the keyed rule)."""


def _greedy_rule(batch: AcceptanceInput) -> AcceptResult:
    return greedy_accept(batch.draft_tokens, batch.num_draft, batch.target_logits)


def _point_mass_rule(batch: AcceptanceInput) -> AcceptResult:
    p = process_logits(batch.target_logits, batch.sampling)  # [B, k+1, vocab]
    return point_mass_accept(batch.draft_tokens, batch.num_draft, p, batch.u_accept,
                             batch.u_sample)


def _speculative_rule(batch: AcceptanceInput) -> AcceptResult:
    if batch.draft_probs is None:  # no q on the wire: q is a point mass on each draft
        return _point_mass_rule(batch)
    p = process_logits(batch.target_logits, batch.sampling)  # [B, k+1, vocab]
    return speculative_accept(batch.draft_tokens, batch.num_draft, p, batch.draft_probs,
                              batch.u_accept, batch.u_sample)


def _keyed_rule(batch: AcceptanceInput) -> AcceptResult:
    p = process_logits(batch.target_logits, batch.sampling)  # [B, k+1, vocab]
    return keyed_accept(batch.draft_tokens, batch.num_draft, p, batch.noise)


def _cascade_rule(name: str) -> Callable[[AcceptanceInput], AcceptResult]:
    """A speculative-cascade rule (cascade.core.accept.cascades): verify against its target pi. At
    temperature 0 the argmax of pi decides, built from the temperature-1 distributions."""

    def rule(batch: AcceptanceInput) -> AcceptResult:
        k = batch.draft_tokens.shape[1]
        if k == 0:  # nothing drafted: the target's own token, as the lossless rules pick it
            lossless = _greedy_rule if batch.sampling.is_greedy else _point_mass_rule
            return lossless(batch)._replace(num_deferred=torch.zeros_like(batch.num_draft))
        if batch.draft_probs is None:
            raise ValueError(f"acceptance rule {name} needs the drafter's q with every block")
        p_decide = torch.softmax(batch.target_logits.float(), -1).double()  # [B, k+1, vocab]
        q_decide = batch.draft_probs if batch.decision_probs is None else batch.decision_probs
        if batch.sampling.is_greedy:
            pi, deferred = cascade_target(name, batch.alpha, p_decide[:, :k], q_decide,
                                          p_decide[:, :k], q_decide, batch.draft_tokens)
            target = torch.cat([pi, p_decide[:, k:]], 1)
            result = greedy_accept(batch.draft_tokens, batch.num_draft, target)
        else:
            p = process_logits(batch.target_logits, batch.sampling).double()
            pi, deferred = cascade_target(name, batch.alpha, p_decide[:, :k], q_decide,
                                          p[:, :k], batch.draft_probs.double(),
                                          batch.draft_tokens)
            result = speculative_accept(batch.draft_tokens, batch.num_draft,
                                        torch.cat([pi, p[:, k:]], 1), batch.draft_probs,
                                        batch.u_accept, batch.u_sample)
        verified = torch.minimum(result.num_accepted + 1, batch.num_draft)  # [B]
        counted = torch.arange(k).unsqueeze(0) < verified.unsqueeze(1)  # [B, k]
        return result._replace(num_deferred=(deferred & counted).sum(-1))

    return rule


ACCEPTANCE_RULES: dict[AcceptanceRule, Callable[[AcceptanceInput], AcceptResult]] = {
    AcceptanceRule.GREEDY: _greedy_rule,
    AcceptanceRule.SPECULATIVE: _speculative_rule,
    AcceptanceRule.POINT_MASS: _point_mass_rule,
    AcceptanceRule.KEYED: _keyed_rule,
    AcceptanceRule.RECURSIVE: _speculative_rule,  # a chain's one child per node
    **{rule: _cascade_rule(rule.value) for rule in AcceptanceRule if not rule.is_lossless},
}
"""Every rule a session can name, as one function over AcceptanceInput."""


def accept(rule: AcceptanceRule, batch: AcceptanceInput) -> AcceptResult:
    """Apply ``rule`` to a batch (the one place a rule is dispatched)."""
    return ACCEPTANCE_RULES[rule](batch)

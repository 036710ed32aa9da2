"""What one round moves: the drafter's ``Draft``, the verifier's ``RoundOutcome`` and, for
feature drafters, the ``TargetFeatures`` of the positions it committed."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cascade.protocol.logprobs import TokenLogprobs
from cascade.protocol.settings import FinishReason, SamplingParams
from cascade.protocol.trees import is_chain


@dataclass
class Draft:
    """k drafted tokens and, for sampling, the sparse proposal each was sampled from."""

    tokens: list[int]
    q_ids: torch.Tensor | None = None
    """[k, K] int64 token ids of the proposal support, most likely first."""
    q_probs: torch.Tensor | None = None
    """[k, K] float32 probabilities matching q_ids (zeros pad a smaller support)."""
    decision_ids: torch.Tensor | None = None
    """Speculative cascades when sampling: [k, K] the support of the drafter's temperature-1
    distribution, which the deferral rules decide on (None: they decide on q)."""
    decision_probs: torch.Tensor | None = None
    """[k, K] float32 probabilities matching decision_ids."""
    parents: list[int] | None = None
    """A token tree: each node's parent index, -1 for the root (``cascade.core.trees``);
    None for a chain (a chain's parents are normalised to None)."""
    source: str = ""
    """What drafted it (Round.draft_source, one of ``methods.DRAFT_SOURCES``); empty: the
    drafter model (or nothing, for an empty draft)."""
    survival: list[float] | None = None
    """The method's own estimate, per drafted token, of the chance it is reached and accepted
    (the speculation memory's match frequencies); None when it has none."""

    @property
    def expected(self) -> float | None:
        """The tokens it expects to have accepted (None: no estimate)."""
        return None if self.survival is None else float(sum(self.survival))

    def __post_init__(self) -> None:
        if self.parents is not None and is_chain(self.parents):
            self.parents = None

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def has_proposal(self) -> bool:
        return self.q_ids is not None

    def prefix(self, n: int) -> Draft:
        """The first ``n`` drafted tokens with their proposals: a block in its own right (each
        token was sampled from its own q, whatever follows it; a tree's first n nodes are a
        tree, parents come first)."""
        if n >= self.num_tokens:
            return self
        cut = (lambda t: None if t is None else t[:n])
        return Draft(self.tokens[:n], cut(self.q_ids), cut(self.q_probs),
                     cut(self.decision_ids), cut(self.decision_probs), cut(self.parents),
                     self.source, cut(self.survival))


@dataclass(frozen=True)
class RoundOutcome:
    """What verifying one draft decided."""

    num_accepted: int
    """Drafted tokens accepted and committed (a prefix of the draft; a stop token or the
    length limit among them ends them there)."""
    tokens: list[int]
    """Tokens committed this round: the accepted ones plus the recovered or bonus token,
    cut short at a stop token or the length limit, then any filled tokens."""
    committed_len: int
    """Total committed length (prompt included) after this round."""
    finish_reason: FinishReason | None = None
    num_deferred: int = 0
    """Cascade rules: verified drafted positions the target's distribution decided."""
    path: tuple[int, ...] | None = None
    """A tree's accepted node indices, from a root child down (None for a chain)."""
    logprobs: tuple[TokenLogprobs, ...] | None = None
    """SamplingParams.logprobs asked: one per emitted token."""
    prompt_logprobs: tuple[TokenLogprobs, ...] | None = None
    """SamplingParams.prompt_logprobs asked, on the sequence's first round: one per prompt
    token after the first (``cascade.core.verify.logprobs``)."""
    num_forced: int = 0
    """Emitted tokens whose position the grammar forced (the processed p a point mass there):
    accepted drafts, the verifier's own token, and the filled ones."""
    num_filled: int = 0
    """The last ``num_filled`` of ``tokens``: forced positions after the verifier's own token
    it filled in without a pass (jump-forward); the next pass feeds them."""

    def num_judged(self, num_drafted: int) -> int:
        """Drafted tokens the round judged: all it verified, unless a stop token among the
        accepted ones ended the generation there (the round then emits no token of the
        verifier's own), when the drafts after it were never judged."""
        own = len(self.tokens) - self.num_filled - self.num_accepted
        is_cut = self.finish_reason is not None and own <= 0
        return self.num_accepted if is_cut else num_drafted


def token_logprobs(logits: torch.Tensor, tokens: list[int], top: int
                   ) -> tuple[TokenLogprobs, ...]:
    """``logits``: [len(tokens), vocab], the rows that predicted ``tokens``."""
    logp = torch.log_softmax(logits.float(), dim=-1)  # [n, vocab]
    chosen = logp.gather(-1, torch.tensor(tokens).unsqueeze(-1)).squeeze(-1).tolist()
    best = torch.topk(logp, top, dim=-1) if top else None
    return tuple(TokenLogprobs(c, tuple(best.indices[i].tolist()) if best else (),
                               tuple(best.values[i].tolist()) if best else ())
                 for i, c in enumerate(chosen))


@dataclass(frozen=True)
class TargetFeatures:
    """Per-position data from the verifier: the target's hidden states at some positions."""

    start: int
    """Position (in the committed sequence) of the first row."""
    hidden_states: torch.Tensor
    """[n, layers * hidden] for positions start .. start + n - 1 (the requested layers side by
    side)."""


def cut_at_limits(emitted: list[int], params: SamplingParams, num_generated: int
                  ) -> tuple[list[int], FinishReason | None]:
    """A round's tokens cut at the first stop token or at max_new_tokens (after
    ``num_generated`` tokens), and why that ends the generation (None: it goes on)."""
    stops = [i for i, token in enumerate(emitted) if token in params.stop_token_ids]
    if stops:
        emitted = emitted[: stops[0] + 1]
    finish = FinishReason.STOP if stops else None
    if len(emitted) >= params.max_new_tokens - num_generated:
        emitted = emitted[: params.max_new_tokens - num_generated]
        finish = finish or FinishReason.LENGTH
    return emitted, finish

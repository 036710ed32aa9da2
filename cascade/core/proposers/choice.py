"""How the model drafter turns a logits row into a drafted token and the proposal it sends.

Greedy: the argmax (with the temperature-1 top K when a cascade rule will decide on it). Sampling:
the row through ``process_logits`` (temperature, top-k, top-p), its top ``max_proposal_tokens``
renormalised in float32 (exactly the q on the wire), and a token drawn from that with the
position's uniform; the keyed rule draws the keyed choice and sends no q. The row is the one the
processors shaped (``cascade.core.proposers.shaping``), so q is what it proposes from.
"""

from __future__ import annotations

import torch

from cascade.core.blocks import Draft
from cascade.core.sample.sampling import (
    STREAM_DRAFT,
    KeyedNoise,
    keyed_choice,
    position_uniform,
    process_logits,
    sample_from,
    sparsify,
)
from cascade.protocol.settings import DraftConfig, SamplingParams


class TokenChoice:
    """One sequence's choice of drafted tokens."""

    def __init__(self, sampling: SamplingParams, config: DraftConfig, noise: KeyedNoise | None,
                 needs_greedy_q: bool) -> None:
        """``noise``: the keyed rule's (None: another rule); ``needs_greedy_q``: a cascade rule
        decides on the drafter's temperature-1 distribution."""
        self.sampling, self.config, self.noise = sampling, config, noise
        self.keyed = noise is not None
        self.needs_greedy_q = needs_greedy_q

    def is_unsure(self, logits: torch.Tensor) -> bool:
        config = self.config
        if config.min_confidence <= 0.0 and config.max_entropy <= 0.0:
            return False
        probs = torch.softmax(logits.float(), dim=-1)
        if float(probs.max()) < config.min_confidence:
            return True
        entropy = -float(torch.special.xlogy(probs, probs).sum())
        return config.max_entropy > 0.0 and entropy > config.max_entropy

    def choose(self, logits: torch.Tensor, position: int):
        """One drafted token at ``position``, the sparse q it was drawn from, and the sparse
        temperature-1 distribution a cascade rule decides on when that differs from q (at
        temperature 0: the argmax, with the temperature-1 q when a cascade rule will decide)."""
        if self.sampling.is_greedy:
            if not self.needs_greedy_q:
                return int(logits.argmax()), None, None, None, None
            ids, values = self._temperature_one(logits)
            return int(logits.argmax()), ids, values, None, None
        probs = process_logits(logits.unsqueeze(0), self.sampling)  # [1, vocab]
        if self.keyed:
            return int(keyed_choice(probs, self.noise.rows([position]))[0]), None, None, None, None
        ids, values = sparsify(probs, self.config.max_proposal_tokens)  # [1, K] each
        uniform = position_uniform(self.sampling.seed, position, STREAM_DRAFT)
        column = int(sample_from(values, torch.tensor([uniform], dtype=torch.float64))[0])
        decision = (None, None)
        if self.needs_greedy_q and not self._q_is_temperature_one:
            decision = self._temperature_one(logits)
        return int(ids[0, column]), ids[0], values[0], *decision

    @property
    def _q_is_temperature_one(self) -> bool:
        s = self.sampling
        return s.temperature == 1.0 and s.top_k == 0 and s.top_p >= 1.0

    def _temperature_one(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[K] ids and probs of the drafter's raw (temperature-1) distribution's top K."""
        ids, values = sparsify(torch.softmax(logits.float(), -1)[None],
                               self.config.max_proposal_tokens)
        return ids[0], values[0]

    def draft(self, tokens: list[int], rows: list) -> Draft:
        """``rows``: per token (q ids, q probs, decision ids, decision probs), None when absent."""
        if not rows or rows[0][0] is None or not self.config.send_proposal:
            return Draft(tokens=tokens)
        q_ids, q_probs, decision_ids, decision_probs = (list(column) for column in zip(*rows))
        draft = Draft(tokens, torch.stack(q_ids), torch.stack(q_probs))
        if decision_ids[0] is not None:
            draft.decision_ids, draft.decision_probs = (torch.stack(decision_ids),
                                                        torch.stack(decision_probs))
        return draft

"""The drafter model proposes k tokens (and, for sampling, the sparse q each was sampled from).

The drafter model is either a small causal LM (``ModelRunner``) or a feature drafter
(``FeatureRunner``): both hand out caches that answer ``forward_to`` and ``extend`` with logits,
and a feature drafter's cache also takes the target's features (``observe``).

Its cache follows the committed tokens by position (``SequenceCache.forward_to``): after a
verdict, the rejected tail is dropped and the next round starts from the committed sequence, so
the proposer needs no notion of what the verifier accepted beyond the tokens themselves.
"""

from __future__ import annotations

import torch

from cascade.core.blocks import Draft, TargetFeatures
from cascade.core.proposers.base import Proposer, ProposerContext
from cascade.core.sampling import STREAM_DRAFT, position_uniform, process_logits, sample_from, sparsify


class ModelProposer(Proposer):
    """Drafts with the drafter model's own KV cache."""

    def __init__(self, context: ProposerContext) -> None:
        super().__init__(context)
        self.cache = context.runner.new_cache()
        self.wants_target_features = getattr(self.cache, "wants_target_features", False)
        self.feature_layers = getattr(context.runner, "feature_layers", ())

    def observe(self, features: TargetFeatures) -> None:
        if self.wants_target_features:
            self.cache.observe(features.start, features.hidden_states)

    def propose(self, committed: list[int], num_tokens: int) -> Draft:
        if num_tokens <= 0:
            return Draft(tokens=[])
        logits = self.cache.forward_to(committed).logits[-1]  # [vocab]
        tokens, q_ids, q_probs = [], [], []
        for i in range(num_tokens):
            if i > 0 and self._is_unsure(logits):
                break
            token, ids, probs = self._choose(logits, len(committed) + i)
            tokens.append(token)
            q_ids.append(ids)
            q_probs.append(probs)
            if i < num_tokens - 1:
                logits = self.cache.extend([token]).logits[-1]
        return self._draft(tokens, q_ids, q_probs)

    def _is_unsure(self, logits: torch.Tensor) -> bool:
        if self.config.min_confidence <= 0.0:
            return False
        return float(torch.softmax(logits, dim=-1).max()) < self.config.min_confidence

    def _choose(self, logits: torch.Tensor, position: int):
        """One drafted token at ``position`` and the sparse q it was drawn from (at temperature
        0: the argmax, and the temperature-1 q when a cascade rule will decide on it)."""
        if self.sampling.is_greedy:
            if not self.needs_greedy_q:
                return int(logits.argmax()), None, None
            ids, values = sparsify(torch.softmax(logits.float(), -1)[None],
                                   self.config.max_proposal_tokens)
            return int(logits.argmax()), ids[0], values[0]
        probs = process_logits(logits.unsqueeze(0), self.sampling)  # [1, vocab]
        ids, values = sparsify(probs, self.config.max_proposal_tokens)  # [1, K] each
        uniform = position_uniform(self.sampling.seed, position, STREAM_DRAFT)
        column = int(sample_from(values, torch.tensor([uniform], dtype=torch.float64))[0])
        return int(ids[0, column]), ids[0], values[0]

    def _draft(self, tokens: list[int], q_ids: list, q_probs: list) -> Draft:
        if not q_ids or q_ids[0] is None or not self.config.send_proposal:
            return Draft(tokens=tokens)
        return Draft(tokens=tokens, q_ids=torch.stack(q_ids), q_probs=torch.stack(q_probs))

"""Suffix decoding: draft what followed the context's suffix in the session's own tokens and in
the cluster's finished generations (the pod's speculation memory, ``cascade.core.memory.suffix_index``),
scored as SuffixDecoding scores a suffix tree (``cascade.core.memory.suffix_draft``). No model; its
blocks carry no q (at temperature > 0 they are verified with q a point mass on each drafted
token, still lossless). With ``tree_nodes`` it drafts the most probable nodes as a token tree.

A memory draft's length follows its match, not k: its budget is ``LOOKUP_TOKENS``
(``DraftConfig.longest_block``; k bounds the drafter model's blocks in ``suffix_then_model``),
each token kept while its probability stays above ``min_token_prob`` (long drafts only where
earlier text continued the same way); a planning verifier still cuts the block to what pays at
its load.
"""

from __future__ import annotations

from cascade.core.blocks import Draft
from cascade.core.proposers.base import EstimatesOwnDrafts, Proposer, ProposerContext
from cascade.core.proposers.hybrid import LookupThenModel
from cascade.core.memory.suffix_draft import SuffixParams, best_draft
from cascade.core.memory.candidates import Candidates, MemoryLimits, context_candidates

MIN_SCORE = 1.5
"""suffix_then_model sends the lookup's draft when it expects at least this many accepted
tokens (the drafter model expects about 1.5-2 at k = 4 on chat), else the model's."""


class SuffixProposer(Proposer, EstimatesOwnDrafts):
    """The best-scoring continuation of the session's own tokens and its scope's memory."""

    needs_model = False

    def __init__(self, context: ProposerContext, params: SuffixParams = SuffixParams()) -> None:
        super().__init__(context)
        self.memory = context.memory
        self.limits = self.memory.index.limits if self.memory is not None else MemoryLimits()
        self.params = params

    def propose(self, committed: list[int], num_tokens: int, stop=None) -> Draft:
        if num_tokens <= 0:
            return Draft([])
        own = context_candidates(committed, self.limits)
        remembered = (self.memory.candidates(committed) if self.memory is not None
                      else Candidates.none(self.limits.max_depth))
        depth, nodes = num_tokens, 0
        if self.config.tree_nodes:  # a tree: at most k deep, and no deeper than can be emitted
            nodes, depth = self.config.tree_shape(num_tokens, self.depth_left(committed))
        draft = best_draft(own + remembered, depth, self.params, tree_nodes=nodes)
        from_memory = bool((remembered.match_lens >= max(draft.match_len, 1)).any())
        return Draft(draft.tokens, parents=draft.parents, survival=draft.probs,
                     source="memory" if from_memory else "suffix")

    def ready(self, committed: list[int]) -> int:
        budget = self.config.budget(self.sampling, len(committed) - self.prompt_len)
        draft = self.propose(committed, budget)
        return draft.num_tokens if (draft.expected or 0.0) >= MIN_SCORE else 0


class SuffixThenModelProposer(LookupThenModel, EstimatesOwnDrafts):
    """The memory's draft when it expects at least ``MIN_SCORE`` accepted tokens, else the
    drafter model's."""

    lookup_class = SuffixProposer

    @property
    def can_guess(self) -> bool:
        """No pre-drafting: guesses come from the model's distributions, which say nothing of
        what the memory will draft next (and a guess that missed would cap the memory's
        block at k)."""
        return False

    def propose(self, committed: list[int], num_tokens: int, stop=None) -> Draft:
        """The memory's draft where it scores, else the model's within k and the plan (none
        planned: the memory's draft whatever its score, which the verifier cuts by)."""
        looked_up = self.lookup.propose(committed, num_tokens)
        if self.prefers(looked_up):
            return looked_up
        most = min(num_tokens, self.config.num_draft_tokens)
        if self.planned is not None:
            most = min(most, self.planned)
        return self.model.propose(committed, most, stop) if most else looked_up

    def ready(self, committed: list[int]) -> int:
        return self.lookup.ready(committed)

    def prefers(self, draft: Draft) -> bool:
        return bool(draft.tokens) and (draft.expected or 0.0) >= MIN_SCORE


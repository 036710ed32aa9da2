"""A lookup method with the drafter model behind it: each round drafts from the lookup when its
draft is worth sending, else from the model. The model keeps its own state whichever drafts, so
switching per round costs nothing; what it observes (target features) it observes always."""

from __future__ import annotations

from cascade.core.blocks import Draft, TargetFeatures
from cascade.core.proposers.base import Guesses, Proposer, ProposerContext
from cascade.core.proposers.model import ModelProposer


class LookupThenModel(Proposer, Guesses):
    """``lookup_class`` drafts first; ``prefers`` says whether its draft is sent."""

    lookup_class: type[Proposer]

    def __init__(self, context: ProposerContext) -> None:
        super().__init__(context)
        self.lookup = self.lookup_class(context)
        self.model = ModelProposer(context)
        self.wants_target_features = self.model.wants_target_features
        self.feature_layers = self.model.feature_layers

    def prefers(self, draft: Draft) -> bool:
        return bool(draft.tokens)

    def observe(self, features: TargetFeatures) -> None:
        self.model.observe(features)

    def propose(self, committed: list[int], num_tokens: int, stop=None) -> Draft:
        looked_up = self.lookup.propose(committed, num_tokens)
        if self.prefers(looked_up):
            return looked_up
        return self.model.propose(committed, num_tokens, stop)

    @property
    def can_guess(self) -> bool:
        return self.model.can_guess

    def block_distributions(self, committed: list[int], drafted: list[int],
                            parents: list[int] | None = None):
        return self.model.block_distributions(committed, drafted, parents)

    def filled_after(self, context: list[int]) -> list[int]:
        return self.model.filled_after(context)

"""The default drafting method: each round, draft from whichever source expects the most
committed tokens per second of the session's round.

Sources:

- **lookup**: the speculation memory and the session's own tokens (prompt lookup's reach and
  the cluster's finished generations; ``SuffixProposer``). Free to draft; its draft carries
  its own estimates (match frequencies).
- **prediction**: the client's predicted output (``PredictionLookup``). Free to draft; its
  estimates are the session's measured acceptance of earlier prediction blocks.
- **model**: the drafter model (``ModelProposer``), at most k tokens and what the verifier's
  plan asks for. Its estimate is the session's measured acceptance of earlier model blocks;
  drafting it costs the model's measured time per token.

A free source's estimates are scaled by how far its claims have held in the session (``Trust``:
accepted over claimed tokens, moving averages) when sources are compared: a match that occurred
once, or a prediction joined on two tokens of prose, claims a long block, and when such blocks
keep failing the model wins the rounds. The block goes out with its source's own estimates
(scaling those too made the verifier cut blocks to nothing, and a source cut to nothing never
earns its trust back).

A round that drafts n tokens expected to have S of them accepted commits 1 + S tokens (the
verifier adds one of its own) in ``round_s`` (the measured time from block to verdict) plus
the model's drafting, so each source is worth ``(1 + S) / (round_s + model tokens x
draft_token_s)`` (``rate``); the best is drafted, the previous round's source on ties. A
source that stops paying (its acceptance falls) loses to the next; nothing is a fixed
threshold. The verifier's plan (``cascade.core.plan.goodput``) still cuts each block to what pays
at its load, and while it decodes the session alone, ``ready`` tells it when a free source's
draft beats a round decoded alone.

Drafting during verification works as for the model: guesses come from the model's
distributions over whatever block was sent (``block_distributions``), and each guessed
outcome's next block is chosen as above.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from cascade.core.blocks import Draft, TargetFeatures
from cascade.core.proposers.base import (
    EstimatesOwnDrafts,
    Guesses,
    Proposer,
    ProposerContext,
    RoundCosts,
    Shadowing,
)
from cascade.core.proposers.model import ModelProposer
from cascade.core.proposers.prediction import SOURCE as PREDICTION
from cascade.core.proposers.prediction import PredictionLookup
from cascade.core.proposers.suffix import SuffixProposer
from cascade.core.plan.survival import AcceptanceRates, SessionRates
from cascade.protocol.limits import MAX_DRAFT_TOKENS

MODEL = "model"
LOOKUP = "lookup"
TREE_PRIOR = 1.0
"""Tokens a model tree is expected to have accepted before any was verified."""
TREE_WEIGHT = 0.2
"""Weight of one round in a model tree's moving average of accepted tokens."""
TRUST_WEIGHT = 0.3
"""Weight of one round in a lookup source's moving averages of claimed and accepted tokens."""


@dataclass
class Trust:
    """How far a source's own estimates hold in this session: the moving averages of the
    tokens its verified blocks expected and of those accepted (a match that occurred once
    claims every token; on text unlike the memory's, few hold)."""

    claimed: float = 1.0
    accepted: float = 1.0

    @property
    def factor(self) -> float:
        return self.accepted / self.claimed if self.claimed > 0 else 1.0

    def observe(self, claimed: float, accepted: int) -> None:
        self.claimed += TRUST_WEIGHT * (claimed - self.claimed)
        self.accepted += TRUST_WEIGHT * (accepted - self.accepted)


@dataclass(frozen=True)
class Option:
    """What one source would draft this round."""

    source: str
    expected: float
    """Tokens it expects to have accepted."""
    model_tokens: int = 0
    """Tokens the drafter model drafts for it (its drafting time)."""


def rate(option: Option, costs: RoundCosts) -> float:
    """Expected committed tokens per second of the round that drafts ``option``."""
    return (1.0 + option.expected) / (costs.round_s + option.model_tokens * costs.draft_token_s)


def best(options: list[Option], costs: RoundCosts, previous: str | None = None
         ) -> Option | None:
    """The option with the highest ``rate``; on a tie the previous round's source, then the
    first listed (None: no option)."""
    ranked = sorted(options, key=lambda o: (-rate(o, costs), o.source != previous))
    return ranked[0] if ranked else None


class AutoProposer(Proposer, Guesses, EstimatesOwnDrafts, Shadowing):
    """Each round, the source whose draft pays most (the module docstring)."""

    needs_model = False

    def __init__(self, context: ProposerContext) -> None:
        super().__init__(context)
        self.lookup = SuffixProposer(context)
        self.model = ModelProposer(context) if context.runner is not None else None
        self.prediction = (PredictionLookup(context.config.prediction, context.prompt_len,
                                            MAX_DRAFT_TOKENS)
                           if context.config.prediction else None)
        if self.model is not None:
            self.wants_target_features = self.model.wants_target_features
            self.feature_layers = self.model.feature_layers
        self.model_rates = SessionRates(AcceptanceRates(0.0))
        self.tree_accepted = TREE_PRIOR
        self.trust: dict[str, Trust] = {}
        """Per lookup source ("memory", "suffix"): how far its estimates hold."""
        self.claims: dict[str, list[float]] = {}
        """Per lookup source: the estimates of its last draft (what its verdict is held to)."""
        self.previous: str | None = None

    def propose(self, committed: list[int], num_tokens: int, stop=None) -> Draft:
        option, draft = self._choose(committed, num_tokens)
        if option is None:
            return Draft([])
        self.previous = option.source
        self._sent(option, draft)
        if option.source != MODEL:
            return draft
        started = time.perf_counter()
        draft = self.model.propose(committed, option.model_tokens, stop)
        if draft.num_tokens:
            self.costs.observe("draft_token_s",
                               (time.perf_counter() - started) / draft.num_tokens)
        return draft

    def propose_many(self, contexts: list[list[int]], budgets: list[int], stop=None
                     ) -> list[Draft]:
        """Each guessed context's choice; the model's drafts as one batch."""
        chosen = [self._choose(c, b) for c, b in zip(contexts, budgets, strict=True)]
        drafts = [draft for _, draft in chosen]
        for option, draft in chosen:
            if option is not None:
                self._sent(option, draft)
        by_model = [i for i, (option, _) in enumerate(chosen)
                    if option is not None and option.source == MODEL]
        if by_model:
            made = self.model.propose_many([contexts[i] for i in by_model],
                                           [chosen[i][0].model_tokens for i in by_model], stop)
            for i, draft in zip(by_model, made):
                drafts[i] = draft
            if len(made) < len(by_model):  # stopped one at a time: keep the drafts before
                return drafts[:by_model[len(made)]]
        return drafts

    def _choose(self, committed: list[int], num_tokens: int) -> tuple[Option | None, Draft]:
        """The best option for the round after ``committed`` and the free source's draft
        (an empty draft when the model is chosen: it drafts only then)."""
        drafts, options = self._free_options(committed, num_tokens)
        most = self._model_budget(num_tokens)
        if most:
            options.append(Option(MODEL, self._model_expected(most), most))
        option = best(options, self.costs, self.previous)
        return option, drafts.get(option.source, Draft([])) if option else Draft([])

    def _free_options(self, committed: list[int], num_tokens: int
                      ) -> tuple[dict[str, Draft], list[Option]]:
        """The drafts of the sources that cost no drafting time, where they have one, and
        each as an option."""
        drafts = {LOOKUP: self.lookup.propose(committed, num_tokens)}
        if self.prediction is not None and not self.config.tree_nodes:
            drafts[PREDICTION] = self.prediction.propose(committed, num_tokens)
        drafts = {source: d for source, d in drafts.items() if d.tokens}
        return drafts, [Option(source, self._expected(d)) for source, d in drafts.items()]

    def _expected(self, draft: Draft) -> float:
        """A free draft's expected accepted tokens: its own estimate scaled by how far its
        source's estimates have held in this session (``Trust``)."""
        return (draft.expected or 0.0) * self._trust(draft.source).factor

    def _trust(self, source: str) -> Trust:
        return self.trust.setdefault(source, Trust())

    def _sent(self, option: Option, draft: Draft) -> None:
        """Note a chosen free draft: its own estimates are what its verdict is held to."""
        if option.source != MODEL:
            self.claims[draft.source] = list(draft.survival or ())

    def _model_budget(self, num_tokens: int) -> int:
        """Tokens the model may draft: k (a tree's nodes), the budget, the verifier's plan."""
        if self.model is None:
            return 0
        most = num_tokens if self.config.tree_nodes else min(num_tokens,
                                                             self.config.num_draft_tokens)
        return most if self.planned is None else min(most, self.planned)

    def _model_expected(self, num_tokens: int) -> float:
        if self.config.tree_nodes:
            return self.tree_accepted
        return float(sum(self.model_rates.survival(num_tokens)))

    def judged(self, source: str, num_verified: int, num_accepted: int) -> None:
        if source == PREDICTION and self.prediction is not None:
            self.prediction.judged(num_verified, num_accepted)
        if source in self.claims:  # a free source's block
            claimed = sum(self.claims[source][:num_verified])
            self._trust(source).observe(claimed, num_accepted)
        elif not source and num_verified:  # the model's block
            if self.config.tree_nodes:
                self.tree_accepted += TREE_WEIGHT * (num_accepted - self.tree_accepted)
            else:
                self.model_rates.observe(num_verified, num_accepted)

    def ready(self, committed: list[int]) -> int:
        """The best free draft's length when a round drafting it beats a round decoded alone
        (one token per ``alone_s``), else 0."""
        budget = self.config.budget(self.sampling, len(committed) - self.prompt_len)
        drafts, options = self._free_options(committed, budget)
        option = best(options, self.costs)
        if option is None or rate(option, self.costs) <= 1.0 / self.costs.alone_s:
            return 0
        return drafts[option.source].num_tokens

    def shadow_propose(self) -> Callable[..., Draft] | None:
        """The model's shadows: they keep the verifier's estimate of its blocks current."""
        return self.model.propose if self.model is not None else None

    @property
    def can_guess(self) -> bool:
        return self.model is not None and self.model.can_guess

    def guesses_after(self, source: str, num_tokens: int) -> bool:
        """Guess outcomes of the model's blocks, and of free blocks no longer than k: guessing
        costs a pass of the model over the block, which for a short block is about what
        drafting the next model block just in time would cost (short free blocks are the
        unsure ones, often followed by the model's). A long free block's next block is most
        likely free again, known at once from the verdict, and a pass over it would hold the
        model thread while the verifier waits."""
        return not source or num_tokens <= self.config.num_draft_tokens

    def block_distributions(self, committed: list[int], drafted: list[int],
                            parents: list[int] | None = None):
        if self.model is None:
            return None
        return self.model.block_distributions(committed, drafted, parents)

    def filled_after(self, context: list[int]) -> list[int]:
        return self.model.filled_after(context) if self.model is not None else []

    def observe(self, features: TargetFeatures) -> None:
        if self.model is not None:
            self.model.observe(features)

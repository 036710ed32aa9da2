"""The interface every drafting method implements.

A ``Proposer`` drafts for one sequence: ``propose(committed, num_tokens)`` returns up to that many
tokens after the committed ones (with the sparse q they were sampled from, when the method has
one). The committed tokens are the only state the loop hands over, so a proposer keeps whatever
else it needs (a KV cache, a suffix index) itself. Methods that draft from the target's own
features ask for them with ``wants_target_features`` and receive them through ``observe``.

Whatever a method may do beyond proposing and observing is a small protocol the drafter asks
for: ``Guesses`` (pre-drafting for guessed outcomes while a block is verified,
``drafter_service.speculation``: it ranks them from ``block_distributions`` and may stop a
pre-draft between tokens, ``stop``), ``EstimatesOwnDrafts`` (drafts that carry their own
survival estimates) and ``Shadowing`` (who drafts shadow blocks).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

import torch

from cascade.core.blocks import Draft, TargetFeatures
from cascade.core.model.runner import ModelRunner
from cascade.core.memory.suffix_index import SessionMemory
from cascade.protocol.settings import DraftConfig, SamplingParams
from cascade.protocol.acceptance import AcceptancePolicy


COST_WEIGHT = 0.2
"""Weight of one measurement in ``RoundCosts``' moving averages."""


@dataclass
class RoundCosts:
    """What a session's rounds cost, as its drafter loop measures them (moving averages,
    seconds); a method that chooses between sources each round weighs them by these."""

    round_s: float = 0.05
    """From sending a block to its verdict (the verifier's pass, its queue, the way there and
    back)."""
    alone_s: float = 0.05
    """Between verdicts of rounds the verifier decodes alone (a token each)."""
    draft_token_s: float = 0.005
    """The drafter model's time per drafted token."""

    def observe(self, name: str, seconds: float) -> None:
        """One measurement of ``name`` (one of the fields)."""
        if seconds > 0:
            old = getattr(self, name)
            setattr(self, name, old + COST_WEIGHT * (seconds - old))


class DraftStopped(Exception):
    """A pre-draft was stopped because the verdict it guessed arrived."""


@dataclass(frozen=True)
class ProposerContext:
    """What a proposer is built from."""

    runner: ModelRunner | None
    """The drafter model, when the pod has one (methods with ``needs_model`` require it)."""
    sampling: SamplingParams
    config: DraftConfig
    policy: AcceptancePolicy | None = None
    """The session's acceptance policy: lossy rules need q with every block, greedy too."""
    prompt_len: int = 0
    """Where the generated tokens start in ``committed`` (the adaptive schedule counts from
    there)."""
    memory: SessionMemory | None = None
    """The pod's speculation memory under this session's scope (``cascade.core.memory.suffix_index``);
    None: the memory is off for it."""
    prefix_scope: str = ""
    """Whose sessions' caches its cache may copy a prompt prefix from
    (``cascade.core.kv.prefix_share``)."""


class Proposer(ABC):
    """Drafts blocks for one sequence."""

    needs_model: ClassVar[bool] = True
    """Whether the method needs the drafter model (prompt lookup does not)."""
    wants_target_features: ClassVar[bool] = False
    """Whether the verifier should send the target's hidden states to ``observe`` (a class
    may decide per instance, as the model proposer does for a feature drafter)."""
    feature_layers: tuple[int, ...] = ()
    """Which of the target's layers (transformers' hidden_states indices) it wants."""
    planned: int | None = None
    """The verifier's plan for the next block's length (planned sessions; None: none yet)."""

    def __init__(self, context: ProposerContext) -> None:
        if self.needs_model and context.runner is None:
            raise ValueError(f"draft method {context.config.method} needs a drafter model")
        self.sampling = context.sampling
        self.config = context.config
        self.prompt_len = context.prompt_len
        self.needs_greedy_q = context.policy is not None and not context.policy.rule.is_lossless
        self.costs = RoundCosts()
        """Measured by the drafter loop that runs this proposer (priors until then)."""

    def depth_left(self, committed: list[int]) -> int:
        """Most drafted tokens after ``committed`` that can still be emitted (a tree's depth)."""
        return self.sampling.max_drafts_after(len(committed) - self.prompt_len)

    @abstractmethod
    def propose(self, committed: list[int], num_tokens: int,
                stop: Callable[[], bool] | None = None) -> Draft:
        """Draft up to ``num_tokens`` tokens after ``committed`` (may return fewer, even 0).
        ``stop``: checked between drafted tokens; when it returns True, raise ``DraftStopped``."""

    def propose_many(self, contexts: list[list[int]], budgets: list[int],
                     stop: Callable[[], bool] | None = None) -> list[Draft]:
        """A draft after each context (pre-drafting for guessed outcomes); one ``propose`` each
        unless the method batches them. When ``stop`` turns true it returns what it has: drafts
        shorter than their budget (a batching method) or fewer drafts (one at a time)."""
        drafts = []
        for context, budget in zip(contexts, budgets, strict=True):
            try:
                drafts.append(self.propose(context, budget, stop))
            except DraftStopped:
                break
        return drafts

    def observe(self, features: TargetFeatures) -> None:
        """Receive the target's features for newly committed positions (default: ignore)."""

    def judged(self, source: str, num_verified: int, num_accepted: int) -> None:
        """A block this proposer drafted (``source``: its ``Draft.source``) was verified: its
        first ``num_verified`` tokens (a tree's nodes) checked, ``num_accepted`` kept
        (default: ignore)."""


@runtime_checkable
class Guesses(Protocol):
    """A proposer whose blocks' outcomes can be guessed while they are verified: the drafter
    pre-drafts the next block for the likeliest ones (``drafter_service.predrafts``)."""

    @property
    def can_guess(self) -> bool:
        """Whether this instance may pre-draft after guessed (uncommitted) contexts."""
        ...

    def guesses_after(self, source: str, num_tokens: int) -> bool:
        """Whether to guess the outcomes of a block of ``num_tokens`` this proposer drafted
        from ``source`` (``Draft.source``) while it is verified."""
        return True

    def block_distributions(self, committed: list[int], drafted: list[int],
                            parents: list[int] | None = None) -> torch.Tensor | None:
        """[len(drafted) + 1, vocab] the method's distribution after the committed tokens and
        after each drafted node (``parents``: a tree's; None: a chain, whose last row is the
        bonus position), or None when it has none (then no outcome is guessed)."""
        ...

    def filled_after(self, context: list[int]) -> list[int]:
        """The tokens a verifier fills in (jump-forward, ``cascade.core.sample.processors.fill``)
        after a round that leaves ``context`` committed, as far as the method can tell: a
        guess of that round's outcome drafts after them."""
        return []


@runtime_checkable
class EstimatesOwnDrafts(Protocol):
    """A proposer whose drafts carry their own survival estimates: its budget is the whole
    block bound even where a planning verifier asked for fewer tokens (the verifier cuts by
    the estimates; a model behind such a method still keeps to ``planned``), and while the
    verifier decodes the session alone it says when a draft is worth verifying."""

    def ready(self, committed: list[int]) -> int:
        """The length of a draft after ``committed`` the method expects to pay whatever the
        plan says (0: none)."""
        ...


@runtime_checkable
class Shadowing(Protocol):
    """A proposer that names what drafts its shadow blocks (``drafter_service.shadows``)."""

    def shadow_propose(self) -> Callable[..., Draft] | None:
        ...


def guesser(proposer: Proposer) -> Guesses | None:
    """``proposer`` as pre-drafting uses it, or None if it cannot guess."""
    return proposer if isinstance(proposer, Guesses) and proposer.can_guess else None


def shadow_drafter(proposer: Proposer) -> Callable[..., Draft] | None:
    """What drafts shadow blocks while the verifier decodes the session alone: the method's
    own choice (``Shadowing``), else its ``propose``; none for a method that estimates its own
    drafts (it says when they are ready instead)."""
    if isinstance(proposer, Shadowing):
        return proposer.shadow_propose()
    return None if isinstance(proposer, EstimatesOwnDrafts) else proposer.propose

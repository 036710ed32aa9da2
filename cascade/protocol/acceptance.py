"""The acceptance policy of one generation (no torch): which rule verifies its drafts, and the
rule's knob. The rules themselves run in ``cascade.core.accept``."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cascade.protocol.settings import DraftConfig, SamplingParams


class AcceptanceRule(str, Enum):
    """How a verifier decides which drafted tokens to keep (see cascade.core.accept.acceptance)."""

    GREEDY = "greedy"
    """Temperature 0: keep drafted tokens while they equal the target's argmax (lossless)."""
    SPECULATIVE = "speculative"
    """Speculative sampling against the q each block carries; a block without q is verified
    with q a point mass on each drafted token (lossless either way)."""
    POINT_MASS = "point_mass"
    """Speculative sampling with q a point mass on each drafted token; blocks carry no q
    (lossless)."""
    KEYED = "keyed"
    """Position-keyed sampling: the token at position t is the target's Gumbel-max sample
    with noise keyed by (seed, t); drafted tokens (chains or trees) are kept while they are
    that sample, so the text depends on the prompt and seed alone (lossless; no q needed)."""
    RECURSIVE = "recursive"
    """Recursive rejection over siblings (SpecInfer's multi-step speculative sampling): a tree
    node's children, each sampled from the q the block carries, are tried in order against the
    residual of the target's distribution (lossless; on a chain it is speculative sampling)."""
    CHOW = "chow"
    """Speculative cascade (lossy): keep the drafter's q where max q >= 1 - alpha."""
    DIFF = "diff"
    """Speculative cascade (lossy): keep q where max q >= max p - alpha."""
    OPT = "opt"
    """Speculative cascade (lossy): keep q where max q >= max p - alpha * TV(q, p)."""
    TOKEN_V1 = "token_v1"
    """Token-level cascade (lossy): accepted set {v : q(v) >= max p - alpha}."""
    TOKEN_V2 = "token_v2"
    """Token-level cascade (lossy): accepted set {v : p(v) >= max p - alpha}."""
    TOKEN_V3 = "token_v3"
    """Token-level cascade (lossy): accepted set {v : p(v) >= (1 - alpha) max p}."""

    @property
    def is_lossless(self) -> bool:
        """Emitted tokens follow the target's distribution exactly."""
        return self in LOSSLESS_RULES


LOSSLESS_RULES = frozenset({AcceptanceRule.GREEDY, AcceptanceRule.SPECULATIVE,
                            AcceptanceRule.POINT_MASS, AcceptanceRule.KEYED,
                            AcceptanceRule.RECURSIVE})
TREE_RULES = (AcceptanceRule.GREEDY, AcceptanceRule.KEYED, AcceptanceRule.RECURSIVE)
"""The rules that verify token trees."""


@dataclass(frozen=True)
class AcceptancePolicy:
    """The acceptance rule a session is verified with, named in its settings, and its knob."""

    rule: AcceptanceRule
    alpha: float = 0.0
    """Quality knob of lossy rules, in [0, 1]; lossless rules ignore it."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "rule", AcceptanceRule(self.rule))
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {self.alpha}")

    @classmethod
    def default_for(cls, sampling: SamplingParams, draft: DraftConfig | None = None
                    ) -> AcceptancePolicy:
        """Greedy at temperature 0; else speculative sampling, or the point-mass rule when the
        drafter is told not to send q."""
        if sampling.is_greedy:
            return cls(AcceptanceRule.GREEDY)
        if draft is not None and not draft.send_proposal:
            return cls(AcceptanceRule.POINT_MASS)
        return cls(AcceptanceRule.SPECULATIVE)

    def check(self, sampling: SamplingParams) -> None:
        """Raises ValueError when the rule cannot verify at this temperature (the lossy
        cascade rules work at any temperature)."""
        if not self.rule.is_lossless:
            return
        is_greedy_rule = self.rule is AcceptanceRule.GREEDY
        if sampling.is_greedy != is_greedy_rule:
            needs = "temperature 0" if is_greedy_rule else "temperature > 0"
            raise ValueError(f"acceptance rule {self.rule.value} needs {needs}, "
                             f"got temperature {sampling.temperature}")

"""Drafting while the verifier verifies (speculative speculative decoding, DESIGN.md section 5).

While a block is verified, the drafter pre-drafts the next block for its likeliest outcomes
(``cascade.core.plan.speculation.rank_outcomes``; ``drafter_service.predrafts`` makes them) into a
``SpeculationCache``; in mode ``ahead`` it also sends the first ``send_ahead`` of them to the
verifier at once, each tagged with the outcome it assumes (``DraftBlock.assumes``; after a token
tree, with the accepted path). When the verdict arrives:

- a block sent ahead for the real outcome: the verifier is already verifying it (AHEAD_HIT);
- a cached block for the real outcome: it is sent at once (CACHE_HIT);
- otherwise the block is drafted just in time (MISS).

Pre-drafts are ordinary drafts after a guessed context: draft randomness depends only on
(seed, position), so a pre-drafted block is the block the drafter would have drafted after the
verdict, and exactness does not depend on hits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from cascade.core.plan.speculation import Outcome
from cascade.pod.messages import follows, tag_block, verdict_outcome
from cascade.v1 import common_pb2, verifier_pb2


class SpeculationMode(str, Enum):
    OFF = "off"
    """Lock-step: draft after each verdict."""
    CACHE = "cache"
    """Pre-draft for guessed outcomes while the block is verified; send after the verdict."""
    AHEAD = "ahead"
    """As cache, and send the likeliest pre-drafts ahead of the verdict, tagged."""


@dataclass(frozen=True)
class SpeculationConfig:
    mode: SpeculationMode = SpeculationMode.OFF
    fanout: int = 6
    """Guessed next tokens per drafted position (the drafter's top tokens other than its own)."""
    max_blocks: int = 12
    """Pre-drafted blocks per round at most (the likeliest guesses first)."""
    send_ahead: int = 12
    """Pre-drafted blocks sent ahead of the verdict per round (mode ``ahead``; at most
    ``max_blocks``): blocks are small, and a guess sent ahead saves the round trip."""
    miss_tokens: int = 0
    """On a miss, draft at most this many tokens (0: the session's k): the verifier waits for
    that block, and the last positions of a block are the ones least often accepted."""
    max_sessions: int = 4
    """Speculate only while the drafter runs at most this many sessions: pre-drafts use the
    model thread, which a busy drafter needs for the blocks its sessions wait for."""
    keep_partial: bool = True
    """Use a pre-draft the verdict stopped early once it has a few tokens (not drafting them
    again saves time). Its block is shorter than k, and where a block ends depends on timing,
    so a seeded sampled request's text may then vary between runs (its distribution does not);
    False keeps block lengths, and that text, independent of timing."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", SpeculationMode(self.mode))
        if not 1 <= self.fanout <= 64 or not 1 <= self.max_blocks <= 64:
            raise ValueError(f"speculation fanout and max_blocks must be in [1, 64], got "
                             f"{self.fanout} and {self.max_blocks}")
        if not 0 <= self.miss_tokens <= 32:
            raise ValueError(f"miss_tokens must be in [0, 32], got {self.miss_tokens}")
        if self.max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {self.max_sessions}")
        if self.send_ahead < 0:
            raise ValueError(f"send_ahead must be >= 0, got {self.send_ahead}")

    @property
    def is_on(self) -> bool:
        return self.mode is not SpeculationMode.OFF

    @property
    def sends_ahead(self) -> int:
        """Blocks sent ahead per round: at most every pre-draft, none unless mode ``ahead``."""
        return min(self.send_ahead, self.max_blocks) if self.mode is SpeculationMode.AHEAD else 0


@dataclass
class SpeculationCache:
    """The pre-drafted next blocks for one verified block, by the outcome each assumes."""

    blocks: dict[Outcome, verifier_pb2.DraftBlock] = field(default_factory=dict)
    sent: set[Outcome] = field(default_factory=set)
    """Outcomes whose block went to the verifier ahead of the verdict."""

    def add(self, outcome: Outcome, block: verifier_pb2.DraftBlock) -> None:
        self.blocks[outcome] = block

    def tagged(self, outcome: Outcome) -> verifier_pb2.DraftBlock:
        """The block for ``outcome`` as sent ahead (tagged with it); marks it sent."""
        self.sent.add(outcome)
        return tag_block(self.blocks[outcome], outcome)

    def lookup(self, verdict: verifier_pb2.Verdict
               ) -> tuple[verifier_pb2.DraftBlock | None, common_pb2.Speculation]:
        """The next block for what the verdict decided, and where it comes from (None: a miss,
        draft now)."""
        outcome = verdict_outcome(verdict)
        block = self.blocks.get(outcome) if outcome is not None else None
        if block is None or not follows(block, verdict):  # the verifier filled tokens in
            return None, common_pb2.SPECULATION_MISS
        if outcome in self.sent:
            return block, common_pb2.SPECULATION_AHEAD_HIT
        return block, common_pb2.SPECULATION_CACHE_HIT

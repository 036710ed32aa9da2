"""The acceptance counters, one type for every reader: the verifier's sessions and its Prometheus
metrics, the in-process loop, the CLI summary, the benchmark's traces and the pair evaluator
(one round's own statistics: ``cascade.protocol.round_stats``).

Definitions (vLLM's): acceptance rate = accepted / drafted tokens; mean acceptance length =
1 + accepted tokens / drafts (the bonus or recovered token included).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from itertools import zip_longest
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cascade.protocol.round_stats import RoundStats

@dataclass
class SpecStats:
    """Counters over rounds, each round observed once with ``observe``."""

    num_drafts: int = 0
    """Rounds that verified at least one drafted token."""
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_target_passes: int = 0
    """Forward passes of the target after prefill (one per round)."""
    num_emitted_tokens: int = 0
    num_rejections: int = 0
    """Rounds in which the verifier rejected a drafted token (the rest accepted all)."""
    num_deferred_tokens: int = 0
    """Cascade rules: verified drafted positions whose target was the verifier's."""
    num_forced_tokens: int = 0
    """Emitted tokens at positions the grammar forced (it allowed only that token): drafted
    ones (a model drafter fills them without its model) and filled ones."""
    num_filled_tokens: int = 0
    """Forced tokens the verifier filled in after its own token, without a pass of their own
    (jump-forward)."""
    accepted_per_position: list[int] = field(default_factory=list)
    """Accepted drafted tokens by their position in the block (0-based)."""

    def observe(self, num_draft: int, num_accepted: int, num_emitted: int,
                num_deferred: int = 0, num_forced: int = 0, num_filled: int = 0) -> None:
        assert 0 <= num_accepted <= num_draft, "accepted tokens are a prefix of the draft"
        assert 0 <= num_filled <= num_forced <= num_emitted, "filled tokens are forced ones"
        self.num_target_passes += 1
        self.num_deferred_tokens += num_deferred
        self.num_forced_tokens += num_forced
        self.num_filled_tokens += num_filled
        self.num_emitted_tokens += num_emitted
        if num_draft == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_draft
        self.num_accepted_tokens += num_accepted
        self.num_rejections += num_accepted < num_draft
        if len(self.accepted_per_position) < num_draft:
            self.accepted_per_position += [0] * (num_draft - len(self.accepted_per_position))
        for i in range(num_accepted):
            self.accepted_per_position[i] += 1

    def __add__(self, other: SpecStats) -> SpecStats:
        """The counters of both (e.g. of many generations)."""
        counts = {f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)
                  if f.name != "accepted_per_position"}
        per_position = [a + b for a, b in zip_longest(self.accepted_per_position,
                                                      other.accepted_per_position, fillvalue=0)]
        return SpecStats(**counts, accepted_per_position=per_position)

    def observe_round(self, stats: RoundStats, num_emitted: int) -> None:
        """One round as its statistics report it (the dataclass or its message; ``num_emitted``:
        its committed tokens)."""
        self.observe(stats.num_drafted, stats.num_accepted, num_emitted, stats.num_deferred,
                     stats.num_forced, stats.num_filled)

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def mean_draft_length(self) -> float:
        """Drafted tokens per drafted block (k, or less with early stops and schedules)."""
        return self.num_draft_tokens / self.num_drafts if self.num_drafts else 0.0

    @property
    def tokens_per_target_pass(self) -> float:
        return self.num_emitted_tokens / self.num_target_passes if self.num_target_passes else 0.0

    @property
    def position_acceptance(self) -> float | None:
        """Per-position acceptance alpha = accepted / (accepted + rejections): the per-token
        probability the ideal-speedup formula assumes (None before any draft)."""
        tested = self.num_accepted_tokens + self.num_rejections
        return self.num_accepted_tokens / tested if tested else None

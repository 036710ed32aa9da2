"""Adaptive draft length, derived from the committed tokens only.

The schedule starts at k, grows by one after a fully matched block and shrinks by one after an
early miss, within ``DraftConfig.adaptive_bounds``. What "matched" means is fixed by the
committed tokens alone, so a session moved to another drafter (same model) replays the same
lengths: position j matched when the drafter's greedy choice there (its argmax given
``committed[:j]``) equals ``committed[j]``. ``adaptive_length`` replays the schedule over those
match bits from the first generated position: a block of k drafts covers the next k positions;
if all k matched the following position is the verifier's bonus token and the next block starts
after it, otherwise the next block starts after the first miss (the verifier's correction).

With greedy decoding and a greedy (or lossless) rule the replayed blocks are exactly the rounds
that ran, since the verifier accepts a greedy draft exactly while it matches the committed
tokens. When sampling, the bits are a proxy for acceptance; the schedule stays a function of the
committed tokens, which is what a moved session needs.
"""

from __future__ import annotations

from collections.abc import Sequence


def leading_matches(bits: Sequence[bool]) -> int:
    """How many of ``bits`` are true before the first false."""
    for i, bit in enumerate(bits):
        if not bit:
            return i
    return len(bits)


class AdaptiveSchedule:
    """Replays the schedule over match bits as they arrive (they are only ever appended)."""

    def __init__(self, start: int, low: int, high: int) -> None:
        if not low <= start <= high:
            raise ValueError(f"need {low} <= start <= {high}, got {start}")
        self.low, self.high = low, high
        self.position, self.length = 0, start
        """Where the next unsettled block starts, and its length."""

    def advance(self, matches: Sequence[bool]) -> int:
        """The block length after replaying ``matches`` (one bit per generated position, the
        same list as before with bits appended). A block the bits do not settle yet (all known
        bits matched, but fewer than its length) keeps its length."""
        while self.position < len(matches):
            window = matches[self.position:self.position + self.length]
            matched = leading_matches(window)
            if matched == self.length:
                self.position += self.length + 1
                self.length = min(self.length + 1, self.high)
            elif matched < len(window):
                self.position += matched + 1
                self.length = max(self.length - 1, self.low)
            else:
                break
        return self.length


def adaptive_length(matches: Sequence[bool], start: int, low: int, high: int) -> int:
    """The block length after replaying the whole of ``matches`` from the first position."""
    return AdaptiveSchedule(start, low, high).advance(matches)

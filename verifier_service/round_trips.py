"""What drafting a block costs the verifier in time, per session and pooled per drafting method:
the round trip to its drafter besides drafting (the verdict's way there, the pod's queue, the
block's way back), the drafter's time per drafted token, and the share of blocks whose drafting
the verifier waited for (a block pre-drafted while the round before was verified, for the
outcome that came true, costs no drafting wait). Moving averages of weight ``WEIGHT``."""

from __future__ import annotations

from dataclasses import dataclass

WEIGHT = 0.3
"""Weight of one round in each moving average."""


def _average(average: float | None, value: float) -> float:
    """A moving average updated with ``value``; None: none yet."""
    return value if average is None else average + WEIGHT * (value - average)


@dataclass
class Trip:
    """One session's round trips."""

    wait_s: float | None = None
    """Moving average of the verifier's wait for its next block, drafting excepted."""
    draft_token_s: float | None = None
    """Moving average of its drafter's time per drafted token (the blocks' draft_us)."""
    exposed: float | None = None
    """Moving average of the share of its blocks whose drafting the verifier waited for."""
    last_draft_s: float = 0.0
    """Drafting time the verifier waited for, of the block on its way to the scheduler."""
    asked_at: float | None = None
    """When (perf_counter) its last verdict was decided, if it asked for a block."""


class RoundTrips:
    def __init__(self) -> None:
        self.wait_s: dict[str, float] = {}
        self.draft_token_s: dict[str, float] = {}
        self.exposed: dict[str, float] = {}
        """method -> the pooled moving averages of its sessions (as ``Trip``'s)."""

    def arrived(self, method: str, trip: Trip, now: float) -> None:
        """A block reached the scheduler: how long the verifier waited for it, drafting
        excepted, if it asked for one."""
        if trip.asked_at is None:
            return
        waited = max(0.0, now - trip.asked_at - trip.last_draft_s)
        trip.asked_at = None
        trip.wait_s = _average(trip.wait_s, waited)
        self.wait_s[method] = _average(self.wait_s.get(method), waited)

    def drafted(self, method: str, trip: Trip, seconds: float, num_tokens: int,
                predrafted: bool) -> None:
        """A block came in: its drafter took ``seconds`` for ``num_tokens`` tokens;
        ``predrafted``: while the round before was verified (not waited for)."""
        trip.last_draft_s = 0.0 if predrafted else seconds
        if num_tokens <= 0:
            return
        per_token, exposed = seconds / num_tokens, 0.0 if predrafted else 1.0
        trip.draft_token_s = _average(trip.draft_token_s, per_token)
        trip.exposed = _average(trip.exposed, exposed)
        self.draft_token_s[method] = _average(self.draft_token_s.get(method), per_token)
        self.exposed[method] = _average(self.exposed.get(method), exposed)

    def wait(self, method: str, trip: Trip | None = None) -> float:
        """The round trip besides drafting: the session's own (``trip``), if known, else its
        method's."""
        own = trip.wait_s if trip is not None else None
        return own if own is not None else self.wait_s.get(method, 0.0)

    def waited_per_token(self, method: str, trip: Trip | None = None) -> float:
        """Drafting time per drafted token the verifier waits for: the drafter's time per token
        times the share of blocks not pre-drafted (the session's own, if known, else its
        method's)."""
        per_token = trip.draft_token_s if trip is not None else None
        if per_token is None:
            per_token = self.draft_token_s.get(method, 0.0)
        exposed = trip.exposed if trip is not None else None
        if exposed is None:
            exposed = self.exposed.get(method, 1.0)
        return per_token * exposed

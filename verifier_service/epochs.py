"""The highest epoch a verifier has seen per session, kept for a while after the session closes.

An older epoch's open or block is refused while its session's entry is here (FAILED_PRECONDITION
early, instead of verifying for a fenced-out gateway). Entries of closed sessions are dropped
after ``keep_s`` or beyond ``max_closed`` (oldest first), so the map does not grow with every
session ever served. Dropping one costs no correctness: Redis fences every write by epoch, so a
stale gateway that reaches a verifier after that only wastes a little work.
"""

from __future__ import annotations

import time
from collections import OrderedDict


class EpochMemory:
    def __init__(self, keep_s: float = 600.0, max_closed: int = 100_000) -> None:
        self.keep_s, self.max_closed = keep_s, max_closed
        self._open: dict[str, int] = {}
        self._closed: OrderedDict[str, tuple[int, float]] = OrderedDict()
        """session id -> (highest epoch, when it closed), oldest first."""

    def __len__(self) -> int:
        return len(self._open) + len(self._closed)

    def get(self, session_id: str, default: int = 0) -> int:
        if session_id in self._open:
            return self._open[session_id]
        return self._closed.get(session_id, (default, 0.0))[0]

    def opened(self, session_id: str, epoch: int) -> None:
        self._closed.pop(session_id, None)
        self._open[session_id] = max(epoch, self._open.get(session_id, 0))
        self._prune()

    def closed(self, session_id: str) -> None:
        """The session has no stream here any more: remember its epoch for ``keep_s``."""
        epoch = self._open.pop(session_id, None)
        if epoch is not None:
            self._closed[session_id] = (epoch, time.monotonic())
        self._prune()

    def _prune(self) -> None:
        horizon = time.monotonic() - self.keep_s
        while self._closed and (len(self._closed) > self.max_closed
                                or next(iter(self._closed.values()))[1] < horizon):
            self._closed.popitem(last=False)

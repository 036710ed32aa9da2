"""Drafting from the client's predicted output (OpenAI's Predicted Outputs): the text the client
expects back, typically the file an edit re-emits.

The output follows the prediction until an edit makes it diverge, then usually joins it again
further on (after the changed line). So a draft is what follows, in the prediction, the place
where the output's last tokens occur: before anything is generated, the prediction's start;
then the occurrence of the longest suffix of the output (``MAX_JOIN`` tokens down to
``MIN_JOIN``) nearest after where the last draft left off (a prediction repeats lines, and the
output moves forward through it). Nothing is drafted while the output's end occurs nowhere in
the prediction (it is writing something new).

A draft carries its own survival estimates (``Draft.survival``): each position's conditional
acceptance rate, learned from this session's rounds drafted from the prediction (``judged``),
starting high (a client predicts what it expects). So a prediction that stops holding stops
paying in the chooser (``cascade.core.proposers.auto``) and in the verifier's plan.
"""

from __future__ import annotations

import numpy as np

from cascade.core.blocks import Draft
from cascade.core.plan.survival import AcceptanceRates

MAX_JOIN = 8
"""Longest suffix of the output looked up in the prediction."""
MIN_JOIN = 2
"""Shortest suffix accepted as the place the output joins the prediction (one token joins it
anywhere that token occurs)."""
PRIOR = 0.97
"""Conditional acceptance of a prediction's token before any round was drafted from it: an
edit keeps most of a file (one changed line in thirty is a token in about thirty kept)."""
WEIGHT = 0.3
"""Weight of one round in the session's moving averages (a prediction's quality changes fast:
an edited region)."""
SOURCE = "prediction"


class PredictionLookup:
    """One session's predicted output, and how well drafts from it have held."""

    def __init__(self, prediction: tuple[int, ...] | list[int], prompt_len: int,
                 max_tokens: int) -> None:
        self.prediction = np.asarray(prediction, dtype=np.int64)
        self.prompt_len = prompt_len
        self.rates = AcceptanceRates(WEIGHT, [PRIOR] * max_tokens)
        self.cursor = 0
        """Where in the prediction the last draft started: the output has reached at least
        that far into it."""

    def propose(self, committed: list[int], num_tokens: int) -> Draft:
        """What follows the output's place in the prediction, up to ``num_tokens`` tokens."""
        start = self.join(committed[self.prompt_len:])
        if start is None or num_tokens <= 0:
            return Draft([], source=SOURCE)
        tokens = self.prediction[start:start + num_tokens].tolist()
        self.cursor = start
        return Draft(tokens, source=SOURCE, survival=self.rates.survival(len(tokens)))

    def join(self, generated: list[int]) -> int | None:
        """Where the output's continuation starts in the prediction (None: nowhere): after the
        longest match of the output's end, one scan of the prediction for its last
        ``MIN_JOIN`` tokens, then each place's match measured backwards."""
        if not generated:
            return 0
        output = np.asarray(generated[-MAX_JOIN:], dtype=np.int64)
        if len(output) < MIN_JOIN:
            return None
        ends = _ends_of(self.prediction, output[-MIN_JOIN:])
        if not ends.size:
            return None
        lengths = _match_lengths(self.prediction, ends, output)
        return _nearest_after(ends[lengths == lengths.max()], self.cursor)

    def judged(self, num_verified: int, num_accepted: int) -> None:
        """A round drafted from the prediction: its first ``num_verified`` tokens were
        verified and ``num_accepted`` of them kept."""
        self.rates.observe(num_verified, num_accepted)


def _ends_of(haystack: np.ndarray, needle: np.ndarray) -> np.ndarray:
    """Positions right after each occurrence of ``needle`` in ``haystack`` (ascending) that
    leave at least one token to draft."""
    n = len(needle)
    if len(haystack) <= n:
        return np.zeros(0, dtype=np.int64)
    windows = np.lib.stride_tricks.sliding_window_view(haystack[:-1], n)
    return np.flatnonzero((windows == needle).all(axis=1)) + n


def _match_lengths(haystack: np.ndarray, ends: np.ndarray, needle: np.ndarray) -> np.ndarray:
    """How many tokens before each of ``ends`` agree with the end of ``needle``."""
    back = np.arange(1, len(needle) + 1)
    places = ends[:, None] - back[None, :]  # [E, N]: the nearest token first
    agree = (places >= 0) & (haystack[np.maximum(places, 0)] == needle[::-1][None, :])
    return agree.cumprod(axis=1).sum(axis=1)


def _nearest_after(ends: np.ndarray, cursor: int) -> int:
    """The first end at or after ``cursor`` (the output moves forward through the prediction);
    the last one before it when none is."""
    later = ends[ends >= cursor]
    return int(later[0]) if later.size else int(ends[-1])

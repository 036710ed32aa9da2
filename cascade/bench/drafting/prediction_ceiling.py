"""How few rounds any drafter could need for a completion, given the client's predicted output:
a perfect drafter drafts, at every position where the completion follows the prediction
(``cascade.protocol.request.prediction.shared_runs``, what OpenAI's ``accepted_prediction_tokens``
counts), the rest of that run up to ``PREDICTION_TOKENS`` per round, all accepted, and nothing
elsewhere (the verifier decodes those tokens alone). Every round also commits the verifier's own
token.

Comparing the rounds a run needed with these tells how much of a workload's gap is drafting
and how much is the text itself (a model that rewrites the file instead of editing it).
"""

from __future__ import annotations

from collections.abc import Sequence

from cascade.protocol.methods import PREDICTION_TOKENS
from cascade.protocol.request.prediction import shared_runs


def perfect_rounds(prediction: Sequence[int], completion: Sequence[int],
                   block: int = PREDICTION_TOKENS) -> int:
    """The rounds a perfect drafter from ``prediction`` needs to emit ``completion``."""
    left = [0] * len(completion)
    """Per completion position: the matching block's tokens from there on (0: none)."""
    for match in shared_runs(prediction, completion):
        for j in range(match.size):
            left[match.b + j] = match.size - j
    rounds = position = 0
    while position < len(completion):
        position += min(left[position], block) + 1
        rounds += 1
    return rounds

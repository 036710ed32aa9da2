"""Prompt-lookup (n-gram) drafting: propose what followed the last occurrence of the current
suffix in the context. No model, no cost to speak of; it shines when the output copies from the
prompt (summaries, edits of code, quoting)."""

from __future__ import annotations

import numpy as np


def ngram_propose(tokens: list[int], num_tokens: int, max_n: int = 4, min_n: int = 2) -> list[int]:
    """Up to ``num_tokens`` tokens that followed the most recent earlier occurrence of the
    longest suffix of ``tokens`` (length max_n down to min_n); [] when nothing matches."""
    if num_tokens <= 0:
        return []
    context = np.asarray(tokens, dtype=np.int64)
    for n in range(min(max_n, len(tokens) - 1), min_n - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(context[:-1], n)  # [L-n, n]
        hits = np.flatnonzero((windows == context[-n:]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return context[start : start + num_tokens].tolist()
    return []

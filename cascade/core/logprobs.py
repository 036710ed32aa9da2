"""The target's log-probabilities as the verifier returns them: of the tokens a round emits, and
of the prompt (``SamplingParams.prompt_logprobs``, what ``echo`` on /v1/completions shows).

A token's log-probability is the log-softmax of the raw logits row that predicted it (before
temperature, top-k/top-p and the request's processors, as vLLM returns them by default): an
emitted token's row is the one that verified it (row 0 after the committed tokens, then the
accepted nodes' rows); prompt token i's is the row at position i - 1, and the first prompt token
has none (nothing predicts it).

The prompt's rows come from the pass that first feeds the prompt: the sequence asks that pass
for the rows before its usual tail (``Pass.num_leading``), computes the prompt's entries from
them, and gives only the tail to acceptance, so scoring a prompt costs no pass of its own and
never involves the drafter. That pass is the first round's (the prompt, then the drafted block)
or, for a feature drafter's session, the context's prefill (``SequenceVerifier.prefill_features``,
whose one tail row is the prompt's last). A session opened with generated tokens in its context
(moved to another verifier) computes none: its first round already returned them.

Memory: the pass returns the prompt's logits ([prompt - 1, vocab] float32, the one tensor of
that size); the log-softmax runs over ``CHUNK_ROWS`` rows at a time and keeps only each token's
own value and its top N, so no second tensor of the prompt's size is made.
"""

from __future__ import annotations

import torch

from cascade.core.blocks import token_logprobs
from cascade.core.runner import ForwardOutput
from cascade.protocol.logprobs import TokenLogprobs

CHUNK_ROWS = 64
"""Logits rows per log-softmax (64 x 49,152 float32 = 12.6 MB for SmolLM2's vocabulary)."""


def emitted_logprobs(logits: torch.Tensor, path: list[int], emitted: list[int], top: int
                     ) -> tuple[TokenLogprobs, ...]:
    """``logits``: a round's [k+1, vocab] rows; ``path``: the accepted nodes (a chain's: 0 ..
    n - 1); each emitted token from the row that predicted it."""
    rows = ([0] + [node + 1 for node in path])[:len(emitted)]
    return token_logprobs(logits[torch.tensor(rows)], emitted, min(top, logits.shape[-1]))


def chunked_logprobs(blocks: list[torch.Tensor], tokens: list[int], top: int
                     ) -> tuple[TokenLogprobs, ...]:
    """``blocks``: consecutive [n_i, vocab] logits rows, row j of them all predicting
    ``tokens[j]``; scored ``CHUNK_ROWS`` rows at a time."""
    scored: list[TokenLogprobs] = []
    for block in blocks:
        for start in range(0, len(block), CHUNK_ROWS):
            part = block[start : start + CHUNK_ROWS]  # [<= CHUNK_ROWS, vocab]
            scored += token_logprobs(part, tokens[len(scored) : len(scored) + len(part)], top)
    assert len(scored) == len(tokens), (len(scored), len(tokens))
    return tuple(scored)


class PromptLogprobs:
    """One sequence's prompt log-probabilities: pending until the pass that first feeds the
    prompt computes them, then held until the next round's outcome hands them out."""

    def __init__(self, top: int | None, prompt: list[int], is_fresh: bool) -> None:
        """``top``: alternatives per token (None: not asked); ``is_fresh``: the context is the
        prompt alone (nothing was generated before)."""
        self.top, self.prompt = top, prompt
        self.is_pending = top is not None and is_fresh
        self.ready: tuple[TokenLogprobs, ...] | None = None

    def num_leading(self, tail_start: int) -> int:
        """Rows a pass whose tail starts at position ``tail_start`` must return before it:
        all of them while the prompt is pending (its rows are positions 0 .. len - 2)."""
        return tail_start if self.is_pending else 0

    def take(self, output: ForwardOutput, tail_start: int) -> None:
        """Score the prompt from a pass planned with ``num_leading(tail_start)``: its leading
        rows, then the tail's rows that are still the prompt's (a prefill's last row)."""
        if not self.is_pending:
            return
        blocks = [] if output.leading is None else [output.leading]
        blocks.append(output.logits[: len(self.prompt) - 1 - tail_start])
        top = min(self.top, output.logits.shape[-1])
        self.ready = chunked_logprobs(blocks, self.prompt[1:], top)
        self.is_pending = False

    def hand_out(self) -> tuple[TokenLogprobs, ...] | None:
        """The computed entries, once (None: none, or already handed out)."""
        ready, self.ready = self.ready, None
        return ready

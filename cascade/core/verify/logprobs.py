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

Memory: the engine scores those rows itself (``Pass.num_leading``, ``ForwardOutput.leading``
holds the entries): a prompt of more than ``LEADING_CHUNK`` rows is fed that many
positions at a time, each part's logits scored and dropped before the next, and the
log-softmax runs over ``CHUNK_ROWS`` rows at a time keeping only each token's own value and its
top N, so no tensor of the prompt's size times the vocabulary is ever made.
"""

from __future__ import annotations

import torch

from cascade.core.blocks import token_logprobs
from cascade.core.model.runner import ForwardOutput
from cascade.protocol.logprobs import TokenLogprobs

CHUNK_ROWS = 64
"""Logits rows per log-softmax (64 x 49,152 float32 = 12.6 MB for SmolLM2's vocabulary)."""


LEADING_CHUNK = 256
"""Most leading rows (a prompt scored for its log-probabilities) whose logits one pass holds:
a longer prompt is fed that many positions at a time, each part scored before the next (its
[prompt, vocab] float32 logits were 838 MB at 4,000 tokens and a 50k vocabulary)."""


def score_ahead(p, forward_alone) -> tuple[object, list[TokenLogprobs]]:
    """For the engine's row ``p`` (a ``Pass``) with more than LEADING_CHUNK leading rows: all
    but the last LEADING_CHUNK of them fed first, that many at a time
    (``forward_alone(p, end, count)``: the logits of the last ``count`` positions before
    ``end``), each part scored (and dropped) before the next. Returns the row left for the
    step, with LEADING_CHUNK leading rows, and the entries scored."""
    ahead = p.num_leading - LEADING_CHUNK
    if ahead <= 0:
        return p, []
    start, scored = len(p.tokens) - p.num_logits - p.num_leading, []
    for first in range(start, start + ahead, LEADING_CHUNK):
        end = min(first + LEADING_CHUNK, start + ahead)
        logits = forward_alone(p, end, end - first)  # [end - first, vocab]
        scored += token_logprobs(logits, p.tokens[first + 1 : end + 1],
                                 min(p.leading_top, logits.shape[-1]))
    return p._replace(num_leading=LEADING_CHUNK), scored


def leading_entries(p, rows: torch.Tensor, ahead: list[TokenLogprobs]
                    ) -> tuple[TokenLogprobs, ...] | None:
    """The entries of every leading position of the engine's row ``p``: those scored ahead,
    then its leading ``rows`` of the step's logits, each scored for the token after it."""
    if not p.num_leading and not ahead:
        return None
    tail = len(p.tokens) - p.num_logits
    tokens = p.tokens[tail - p.num_leading + 1 : tail + 1]
    return tuple(ahead) + chunked_logprobs([rows[: p.num_leading]], tokens,
                                           min(p.leading_top, rows.shape[-1]))


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
        """The prompt's entries from a pass planned with ``num_leading(tail_start)``: its
        leading rows' (scored by the engine), then the tail's rows that are still the
        prompt's (a prefill's last row)."""
        if not self.is_pending:
            return
        leading = output.leading or ()
        top = min(self.top, output.logits.shape[-1])
        self.ready = tuple(leading) + chunked_logprobs(
            [output.logits[: len(self.prompt) - 1 - tail_start]],
            self.prompt[1 + len(leading):], top)
        self.is_pending = False

    def hand_out(self) -> tuple[TokenLogprobs, ...] | None:
        """The computed entries, once (None: none, or already handed out)."""
        ready, self.ready = self.ready, None
        return ready

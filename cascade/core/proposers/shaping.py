"""The drafter's q shaped as the verifier shapes p, one drafted position at a time.

At every position of a chain the verifier applies the request's processors (logit_bias, the
penalties, bad_words, min_tokens, then the grammar's mask) to p, counting the drafted tokens
before the position (``cascade.core.sample.processors``). The model drafter applies the very same
function to its own logits row, with the same history: the committed tokens (the prompt for
repetition_penalty) and its own earlier drafts in the block. A token the verifier's processors
forbid is then never proposed (it would be rejected and waste the rest of the block); any q
keeps the lossless rules exact, so only acceptance changes.

A position where the grammar allows exactly one token (and no other processor forbids it) is
*forced*: the shaped q and the verifier's processed p are both a point mass there, so the
drafter fills it without a forward pass of its model and without counting it against k
(jump-forward, ``Position.forced``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cascade.core.sample.grammar import GrammarCursor, forced_token
from cascade.core.sample.processors import fill, is_shaping, may_fill, shape
from cascade.protocol.settings import SamplingParams


class DraftShaper:
    """The request's processors and grammar for one sequence's drafts."""

    def __init__(self, params: SamplingParams, prompt_len: int,
                 cursor: GrammarCursor | None) -> None:
        """``cursor``: the grammar's state (None: free text, or a drafter without the
        target's tokenizer)."""
        self.params, self.prompt_len, self.cursor = params, prompt_len, cursor

    def at(self, context: list[int], drafted: list[int]) -> Position:
        """The position after ``context`` (the committed tokens, or a guess of them) and the
        block's ``drafted`` tokens so far."""
        generated = context[self.prompt_len:]
        allowed = None if self.cursor is None else self.cursor.allowed(generated + drafted)
        return Position(self, context[:self.prompt_len], generated, drafted, allowed)

    def fill_after(self, context: list[int], limit: int) -> list[int]:
        """The tokens the verifier fills in after its own token when its round ends with
        ``context`` (``cascade.core.sample.processors.fill``): what a guess of that round must add."""
        generated = context[self.prompt_len:]
        if self.cursor is None or limit <= 0 or not self.cursor.move_to(generated):
            return []
        return fill(self.cursor.state, self.params, generated, limit)


@dataclass
class Position:
    """One drafted position: its history and the grammar's mask there."""

    shaper: DraftShaper
    prompt: list[int]
    generated: list[int]
    drafted: list[int]
    allowed: torch.Tensor | None
    """[vocab] bool: what the grammar allows here (None: no grammar, or a context it does not
    allow)."""

    @property
    def forced(self) -> int | None:
        """The token the grammar forces here, when no other processor forbids it (None: the
        drafter's model chooses)."""
        token = None if self.allowed is None else forced_token(self.allowed)
        before = self.generated + self.drafted
        return token if token is not None and may_fill(self.shaper.params, before,
                                                        token) else None

    def shape(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` ([vocab], the drafter's raw row) as the verifier's processors shape the
        target's at this position (a copy when anything changes)."""
        params = self.shaper.params
        if self.allowed is None and not is_shaping(params, len(self.generated)):
            return logits
        allowed = None if self.allowed is None else self.allowed[None]
        return shape(logits[None], [self.drafted], params, self.prompt, self.generated,
                     allowed)[0]


def point_mass(token: int, vocab_size: int) -> torch.Tensor:
    """A logits row ([vocab]) that allows only ``token``: a forced position's shaped row,
    whatever the drafter's model would have said there."""
    row = torch.full((vocab_size,), float("-inf"))
    row[token] = 0.0
    return row

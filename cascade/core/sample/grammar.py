"""The grammar processor: structured outputs as a mask on the target's logits, per position.

One ``GrammarMatcher`` per sequence holds llguidance's matcher advanced through the committed
(generated) tokens. To mask a block it advances the matcher through the drafted tokens before
each row's position (a chain's earlier drafts, a tree node's ancestors), computes that
position's mask, and rolls back: the rows are visited in order, so moving from one row to the
next rolls back only to the common prefix of their histories. After the round the emitted
tokens are committed. Nothing is re-parsed: each round costs a few token advances and one mask
per row (tens of microseconds on a 49k vocabulary).

A drafted token the grammar forbids gets probability 0 in the masked p, so the acceptance rule
rejects it like any token the target would not choose; rows after it are never reached and
stay unmasked. When the grammar is complete the only allowed token is end-of-sequence, so the
generation ends.

A position whose mask allows exactly one token is *forced* (fixed JSON keys, the punctuation
between fields): ``forced_run`` walks a run of them from the matcher's state and rolls back, so
the verifier can fill them without a pass and the drafter without its model (jump-forward,
``cascade.core.sample.processors.fill``). llguidance's own ``compute_ff_tokens`` is not used: it
tokenizes the forced bytes, which need not be the one token the mask allows; a single allowed
token is exactly what the target must emit.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import llguidance
import llguidance.hf
import torch

from cascade.protocol.grammar import Grammar, to_llguidance

_TOKENIZERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""llguidance's view of each Hugging Face tokenizer (built once: 0.3 s for 49k tokens)."""


def ll_tokenizer(tokenizer, vocab_size: int) -> llguidance.LLTokenizer:
    """llguidance's tokenizer for ``tokenizer``, with masks ``vocab_size`` wide (the logits'
    width, which may exceed the tokenizer's length)."""
    by_size = _TOKENIZERS.setdefault(tokenizer, {})
    if vocab_size not in by_size:
        by_size[vocab_size] = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)
    return by_size[vocab_size]


def prepare(runner) -> None:
    """Build llguidance's tokenizer for ``runner`` at start-up (when it has a tokenizer), so
    the first structured-output session does not wait for it."""
    tokenizer = getattr(runner, "tokenizer", None)
    if tokenizer is not None:
        ll_tokenizer(tokenizer, runner.vocab_size)


def matcher_for(runner, grammar: Grammar | None, generated: list[int]
                ) -> GrammarMatcher | None:
    """A sequence's matcher for a request's grammar on ``runner``'s vocabulary (None: free
    text); ValueError when the target has no tokenizer to match a grammar with."""
    if grammar is None:
        return None
    if runner.tokenizer is None:
        raise ValueError("sampling.grammar: the target has no tokenizer to match a grammar with")
    return GrammarMatcher(grammar, runner.tokenizer, runner.vocab_size, generated)


class GrammarMatcher:
    """A sequence's grammar state: the matcher after the generated tokens."""

    def __init__(self, grammar: Grammar, tokenizer, vocab_size: int,
                 generated: list[int]) -> None:
        """``tokenizer`` is the target's Hugging Face tokenizer; ``generated`` the tokens
        already committed after the prompt (a moved session resumes with them). Raises
        ValueError when the grammar does not compile or ``generated`` does not match it."""
        self.vocab_size = vocab_size
        self.matcher = llguidance.LLMatcher(ll_tokenizer(tokenizer, vocab_size),
                                            to_llguidance(grammar), log_level=0)
        if self.matcher.is_error():
            raise ValueError(f"grammar: {self.matcher.get_error()}")
        if generated:
            self.commit(generated)

    def masks(self, histories: list[list[int]]) -> torch.Tensor:
        """[rows, ceil(vocab / 32)] int32 bitmasks of the tokens allowed at each row's
        position, ``histories[r]`` being the drafted tokens before it; a row behind a forbidden
        drafted token allows everything (it is never reached)."""
        # Imported here: llguidance.torch loads torch.compile's machinery (~2 s at a pod's
        # start-up) that only a request with a grammar needs.
        import llguidance.torch as llg_torch

        bits = llg_torch.allocate_token_bitmask(len(histories), self.vocab_size)
        bits.fill_(-1)
        stack: list[int] = []  # drafted tokens the matcher is advanced through
        for row, history in enumerate(histories):
            common = _common_prefix(stack, history)
            if len(stack) > common:
                self.matcher.rollback(len(stack) - common)
                del stack[common:]
            rest = list(history[common:])
            if rest and self.matcher.validate_tokens(rest) < len(rest):
                continue
            if rest:
                self.matcher.consume_tokens(rest)
                stack += rest
            llg_torch.fill_next_token_bitmask(self.matcher, bits, row)
        if stack:
            self.matcher.rollback(len(stack))
        return bits

    def allowed(self, histories: list[list[int]]) -> torch.Tensor:
        """[rows, vocab] bool: the tokens allowed at each row's position (``masks``)."""
        return unpack(self.masks(histories), self.vocab_size)

    def apply(self, logits: torch.Tensor, histories: list[list[int]]) -> None:
        """``logits`` ([rows, vocab], in place) with the tokens each row's grammar state
        forbids at -inf."""
        logits.masked_fill_(~self.allowed(histories).to(logits.device), float("-inf"))

    def forced_run(self, limit: int, may_take: Callable[[list[int], int], bool]) -> list[int]:
        """From the matcher's state on, the tokens the grammar forces one after another (each
        the only token its position allows) while ``may_take(run, token)``, at most ``limit``;
        the matcher ends where it began. Once the grammar is complete its one token
        (end-of-sequence) ends the run, not fed to the matcher (as in ``commit``)."""
        run: list[int] = []
        consumed = 0
        while len(run) < limit:
            token = forced_token(self.allowed([[]])[0])
            if token is None or not may_take(run, token):
                break
            run.append(token)
            if self.matcher.is_stopped():
                break
            if not self.matcher.consume_token(token):
                raise AssertionError(f"grammar: forced token {token} refused "
                                     f"({self.matcher.get_error()})")
            consumed += 1
        if consumed:
            self.matcher.rollback(consumed)
        return run

    def commit(self, tokens: list[int]) -> None:
        """Advance through emitted tokens (each allowed by its position's mask). Once the
        grammar is complete the matcher takes nothing more: the end-of-sequence token that
        follows is not fed to it."""
        for token in tokens:
            if self.matcher.is_stopped():
                break
            if not self.matcher.consume_token(token):
                raise ValueError(f"grammar: committed token {token} does not match the "
                                 f"grammar ({self.matcher.get_error()})")

    @property
    def is_done(self) -> bool:
        """The grammar accepts nothing more (only end-of-sequence may follow)."""
        return self.matcher.is_stopped()


def unpack(bits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[rows, vocab] bool from [rows, ceil(vocab / 32)] int32 bitmasks (bit j of word w is
    token 32 w + j). Plain tensor ops: llguidance's own helper is a torch.compile kernel,
    which needs a C compiler on the serving machine."""
    shifts = torch.arange(32, dtype=torch.int32)  # [32]
    bit_set = (bits.unsqueeze(-1) >> shifts) & 1  # [rows, words, 32]
    return bit_set.flatten(1)[:, :vocab_size].bool()


def forced_token(allowed: torch.Tensor) -> int | None:
    """The one token ``allowed`` ([vocab] bool) holds, or None (several, or none)."""
    ids = allowed.nonzero()
    return int(ids[0, 0]) if len(ids) == 1 else None


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class GrammarCursor:
    """The drafter's grammar state: follows whatever context it drafts after (the committed
    tokens, a guessed outcome, its own drafts so far) by rolling back to the common prefix
    with the tokens it has been fed, so the drafter proposes only tokens the grammar allows
    (the verifier's mask would reject the others; masking q changes only the proposal, so
    acceptance stays exact)."""

    def __init__(self, grammar: Grammar, tokenizer, vocab_size: int) -> None:
        self.state = GrammarMatcher(grammar, tokenizer, vocab_size, [])
        self.fed: list[int] = []

    def move_to(self, generated: list[int]) -> bool:
        """Be at the end of ``generated`` (the tokens after the prompt); False when the
        grammar does not allow them (a guess that will be rejected)."""
        matcher = self.state.matcher
        common = _common_prefix(self.fed, generated)
        if len(self.fed) > common:
            matcher.rollback(len(self.fed) - common)
            del self.fed[common:]
        rest = list(generated[common:])
        valid = matcher.validate_tokens(rest) if rest else 0
        if valid:
            matcher.consume_tokens(rest[:valid])
            self.fed += rest[:valid]
        return valid == len(rest)

    def allowed(self, generated: list[int]) -> torch.Tensor | None:
        """[vocab] bool: the tokens the grammar allows after ``generated``; None when it does
        not allow ``generated`` itself (a guess that will be rejected)."""
        if not self.move_to(generated):
            return None
        return self.state.allowed([[]])[0]

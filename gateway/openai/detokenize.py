"""Incremental detokenization and stop strings for streamed generations.

Tokens arrive a few at a time, and one character can span several tokens (byte-level BPE splits
"日" into three bytes), so text is only emitted once it decodes cleanly, and text that could be
the start of a stop string is held back until it is known not to be one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

REPLACEMENT_CHAR = "\ufffd"


class Decoder(Protocol):
    """The part of a Hugging Face tokenizer this module uses."""

    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> Any:
        """The text of ``token_ids`` (a str: a list only for a batch, never asked here)."""


class IncrementalDetokenizer:
    """Turns a growing token list into text deltas whose concatenation is the decoded text.

    Decoding the whole list at every step would cost O(n^2) over a long generation, so each step
    decodes only a window: the tokens emitted by the previous step (whose text is known) plus the
    new ones, and emits the difference. The window keeps context that decoders need (a
    SentencePiece leading space, a WordPiece "##" continuation). Text ending in the replacement
    character is an incomplete multi-byte character and waits for the next tokens.
    """

    def __init__(self, tokenizer: Decoder, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self.token_ids: list[int] = []
        self._prefix_offset = 0
        """Start of the decode window: the first token emitted by the previous step."""
        self._read_offset = 0
        """Tokens before this have been emitted as text."""

    def add(self, token_ids: Sequence[int]) -> str:
        """Appends tokens and returns the new text that is safe to show."""
        self.token_ids.extend(token_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """The text still held back, at the end of the generation (may end in U+FFFD)."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        window = self.token_ids[self._prefix_offset :]
        known = self._decode(self.token_ids[self._prefix_offset : self._read_offset])
        text = self._decode(window)
        if len(text) <= len(known) or (text.endswith(REPLACEMENT_CHAR) and not final):
            return ""
        self._prefix_offset, self._read_offset = self._read_offset, len(self.token_ids)
        return text[len(known) :]

    def _decode(self, token_ids: list[int]) -> str:
        if not token_ids:
            return ""
        return self._tokenizer.decode(token_ids, skip_special_tokens=self._skip_special)


class StopStringMatcher:
    """Cuts a text stream at the first stop string, holding back what could begin one."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = [stop for stop in stops if stop]
        self._pending = ""
        self.stopped = False

    @property
    def has_stops(self) -> bool:
        return bool(self._stops)

    def add(self, text: str) -> str:
        """Returns the text that can be shown; sets ``stopped`` once a stop string appeared."""
        if self.stopped:
            return ""
        if not self._stops:
            return text
        buffer = self._pending + text
        cut = min((i for i in (buffer.find(s) for s in self._stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            self._pending = ""
            return buffer[:cut]
        keep = self._partial_stop_length(buffer)
        self._pending = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep]

    def flush(self) -> str:
        """The held-back tail, at the end of the generation (it never became a stop string)."""
        text, self._pending = self._pending, ""
        return "" if self.stopped else text

    def _partial_stop_length(self, buffer: str) -> int:
        """Length of the longest suffix of buffer that is a proper prefix of some stop string."""
        longest = 0
        for stop in self._stops:
            for length in range(min(len(stop) - 1, len(buffer)), longest, -1):
                if buffer.endswith(stop[:length]):
                    longest = length
                    break
        return longest


class TextStream:
    """Tokens in, visible text out: incremental detokenization followed by stop strings.

    With stop strings, tokens are fed one at a time, so the generation ends at the token whose
    text completes a stop string (``num_tokens``) whatever rounds the tokens came in: usage,
    log-probabilities and best_of's ranking then do not depend on k, the plan or load."""

    def __init__(self, tokenizer: Decoder, stops: Sequence[str]) -> None:
        self.detokenizer = IncrementalDetokenizer(tokenizer)
        self.matcher = StopStringMatcher(stops)
        self.num_tokens = 0
        """Tokens of the generation: all added so far, or, once a stop string ended the text,
        those up to and including the token that completed it."""

    @property
    def stopped(self) -> bool:
        """True once a stop string ended the text; later tokens add nothing."""
        return self.matcher.stopped

    def add(self, token_ids: Sequence[int], final: bool = False) -> str:
        """The new visible text; with final, everything held back is released too. Tokens
        after the one that completed a stop string add nothing and are not counted."""
        if self.stopped:
            return ""
        if self.matcher.has_stops and len(token_ids) > 1:
            last = len(token_ids) - 1
            return "".join(self.add([t], final=final and i == last)
                           for i, t in enumerate(token_ids))
        self.num_tokens += len(token_ids)
        text = self.detokenizer.add(token_ids)
        if final:
            text += self.detokenizer.flush()
        visible = self.matcher.add(text)
        if final:
            visible += self.matcher.flush()
        return visible

"""The ``cascade`` extension of streamed chunks: what each draft-verify round did.

Asked for with ``"cascade_rounds": true`` on a streamed request. Every round then gets its own
chunk (even when its text is still held back), carrying a ``cascade`` object beside OpenAI's
fields; OpenAI clients keep unknown fields, so they parse these chunks unchanged:

| key | meaning |
|---|---|
| round | round number within the generation, from 0 |
| tokens | the round's committed tokens in order: ``{"text", "kind"}``; kind is ``accepted`` (drafted and accepted), ``recovered`` (the verifier's correction after a rejection), ``bonus`` (the verifier's extra token after a fully accepted draft), ``target`` (decoded by the target alone, k = 0) or ``filled`` (the grammar allowed only it: filled in after the verifier's token without a pass, jump-forward) |
| drafted | text of each drafted token, rejected ones included |
| parents, path | token trees only: each drafted node's parent index (-1: a child of the last committed token) and the accepted branch (node indices from a root child down) |
| the round's statistics | every field of ``cascade.protocol.round_stats.RoundStats`` by its name (``num_drafted``, ``num_accepted``, ``num_deferred``, ``num_forced``, ``num_filled``, ``num_predrafted``, ``num_sent_ahead``, ``draft_source`` ...), times in milliseconds (``draft_ms``, ``verify_ms``, ``round_ms``), and ``block``: where the round's block came from, ``lock_step`` (drafted after the previous verdict), ``miss`` (the same, the drafter's guesses having missed), ``cache_hit`` (pre-drafted, sent at the verdict), ``ahead_hit`` (pre-drafted and sent ahead) |

A token's ``text`` is what it added to the visible text, so joining the texts of all rounds gives
the completion; a token whose text is held back (part of a multi-byte character, or what could
begin a stop string) shows it with a later token, and tokens after a stop string show nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.openai.detokenize import Decoder, TextStream
from gateway.sessions.generation import GeneratedChunk

def token_kinds(num_tokens: int, num_accepted: int, num_drafted: int, num_filled: int = 0
                ) -> list[str]:
    """Each committed token's origin: the accepted prefix, then the verifier's token, then the
    tokens it filled in."""
    own = num_tokens - num_filled
    if num_drafted == 0:
        return ["target"] * own + ["filled"] * num_filled
    verifier_kind = "bonus" if num_accepted >= num_drafted else "recovered"
    return (["accepted" if i < num_accepted else verifier_kind for i in range(own)]
            + ["filled"] * num_filled)


@dataclass(frozen=True)
class RoundView:
    """One round as the extension shows it."""

    index: int
    texts: tuple[str, ...]
    """What each committed token added to the visible text."""
    drafted: tuple[str, ...]
    chunk: GeneratedChunk
    released: str = ""
    """Held-back text a last round without tokens released (no token of its own to show it)."""

    @property
    def text(self) -> str:
        return "".join(self.texts) + self.released

    def to_json(self) -> dict[str, Any]:
        c = self.chunk
        kinds = token_kinds(len(self.texts), c.stats.num_accepted, c.stats.num_drafted,
                            c.stats.num_filled)
        tree = {"parents": list(c.drafted_parents), "path": list(c.path)} if c.drafted_parents else {}
        return {
            **tree,
            "round": self.index,
            "tokens": [{"text": t, "kind": k} for t, k in zip(self.texts, kinds, strict=True)],
            "drafted": list(self.drafted),
            **c.stats.to_json(),
        }


class RoundReader:
    """Turns chunks into RoundViews, feeding the text stream one token at a time so each token's
    share of the visible text is known."""

    def __init__(self, text: TextStream, tokenizer: Decoder) -> None:
        self._text = text
        self._tokenizer = tokenizer
        self._count = 0

    def read(self, chunk: GeneratedChunk, final: bool) -> RoundView:
        ids = chunk.token_ids
        texts = [self._text.add([t], final=final and i == len(ids) - 1) for i, t in enumerate(ids)]
        released = self._text.add([], final=True) if final and not ids else ""
        drafted = self._drafted(chunk.drafted_tokens)
        view = RoundView(self._count, tuple(texts), drafted, chunk, released)
        self._count += 1
        return view

    def _drafted(self, token_ids: Sequence[int]) -> tuple[str, ...]:
        return tuple(self._tokenizer.decode([t], skip_special_tokens=False) for t in token_ids)

"""The ``logprobs`` of OpenAI's responses, from the target's log-probabilities the verifier
computed for every emitted token (cascade.protocol.logprobs): a token's text is its id decoded
alone (as vLLM returns it), so texts may differ from the visible text where a character spans
tokens or a stop string cut it. An echoed prompt's entries (``prompt_entries``) come first in a
completion's ``logprobs``, as vLLM shapes them."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from cascade.protocol.logprobs import TokenLogprobs
from gateway.openai.detokenize import Decoder


@dataclass(frozen=True)
class LogprobEntry:
    token: str
    logprob: float | None
    """None: a prompt's first token (nothing predicts it)."""
    top: tuple[tuple[str, float], ...] | None
    """None where ``logprob`` is."""


def entries(token_ids: list[int], logprobs: tuple[TokenLogprobs, ...], tokenizer: Decoder
            ) -> tuple[LogprobEntry, ...]:
    text = (lambda t: tokenizer.decode([t], skip_special_tokens=False))  # noqa: E731
    return tuple(LogprobEntry(text(t), lp.logprob, tuple(
        (text(i), v) for i, v in zip(lp.top_ids, lp.top_logprobs)))
        for t, lp in zip(token_ids, logprobs))


def prompt_entries(token_ids: list[int], logprobs: tuple[TokenLogprobs, ...],
                   tokenizer: Decoder) -> tuple[LogprobEntry, ...]:
    """An echoed prompt's entries: ``logprobs`` holds one per token after the first. Each
    token's alternatives include the token itself (vLLM's prompt logprobs: the top N, then
    the token when it is not among them)."""
    first = LogprobEntry(tokenizer.decode(token_ids[:1], skip_special_tokens=False), None, None)
    rest = entries(token_ids[1:], logprobs, tokenizer)
    return (first,) + tuple(entry if token in lp.top_ids else _with_itself(entry)
                            for token, lp, entry in zip(token_ids[1:], logprobs, rest))


def _with_itself(entry: LogprobEntry) -> LogprobEntry:
    if entry.top is None or entry.logprob is None:  # nothing predicted it
        return entry
    return replace(entry, top=entry.top + ((entry.token, entry.logprob),))


def completion_logprobs(items: tuple[LogprobEntry, ...], offset: int = 0) -> dict[str, Any]:
    """Completions' shape: parallel lists; ``offset``: where the first token's text starts in
    the completion text. Each token's alternatives include the token itself, so there may be
    N + 1 of them (OpenAI's legacy completions and vLLM do so; chat's are the top N)."""
    offsets, at = [], offset
    for item in items:
        offsets.append(at)
        at += len(item.token)
    return {"tokens": [i.token for i in items], "token_logprobs": [i.logprob for i in items],
            "top_logprobs": [_top_with_itself(i) for i in items], "text_offset": offsets}


def _top_with_itself(item: LogprobEntry) -> dict[str, float] | None:
    if item.top is None or item.logprob is None:
        return None
    top = dict(item.top)
    top.setdefault(item.token, item.logprob)
    return top


def chat_logprobs(items: tuple[LogprobEntry, ...]) -> dict[str, Any]:
    """Chat's shape: one object per token, its alternatives inside it."""
    def one(token: str, logprob: float | None) -> dict[str, Any]:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}

    return {"content": [{**one(i.token, i.logprob),
                         "top_logprobs": [one(t, v) for t, v in i.top or ()]} for i in items]}

"""The ``logprobs`` of OpenAI's responses, from the target's log-probabilities the verifier
computed for every emitted token (cascade.protocol.logprobs): a token's text is its id decoded
alone (as vLLM returns it), so texts may differ from the visible text where a character spans
tokens or a stop string cut it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cascade.protocol.logprobs import TokenLogprobs
from gateway.detokenize import Decoder


@dataclass(frozen=True)
class LogprobEntry:
    token: str
    logprob: float
    top: tuple[tuple[str, float], ...]


def entries(token_ids: list[int], logprobs: tuple[TokenLogprobs, ...], tokenizer: Decoder
            ) -> tuple[LogprobEntry, ...]:
    text = (lambda t: tokenizer.decode([t], skip_special_tokens=False))  # noqa: E731
    return tuple(LogprobEntry(text(t), lp.logprob, tuple(
        (text(i), v) for i, v in zip(lp.top_ids, lp.top_logprobs)))
        for t, lp in zip(token_ids, logprobs))


def completion_logprobs(items: tuple[LogprobEntry, ...], offset: int = 0) -> dict[str, Any]:
    """Completions' shape: parallel lists; ``offset``: where the first token's text starts in
    the completion text."""
    offsets, at = [], offset
    for item in items:
        offsets.append(at)
        at += len(item.token)
    return {"tokens": [i.token for i in items], "token_logprobs": [i.logprob for i in items],
            "top_logprobs": [dict(i.top) for i in items], "text_offset": offsets}


def chat_logprobs(items: tuple[LogprobEntry, ...]) -> dict[str, Any]:
    """Chat's shape: one object per token, its alternatives inside it."""
    def one(token: str, logprob: float) -> dict[str, Any]:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}

    return {"content": [{**one(i.token, i.logprob),
                         "top_logprobs": [one(t, v) for t, v in i.top]} for i in items]}

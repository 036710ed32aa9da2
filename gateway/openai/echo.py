"""``echo`` on /v1/completions: each choice's text is the prompt followed by the completion, as
OpenAI and vLLM answer it. With ``logprobs`` N the choice's ``logprobs`` covers the prompt's
tokens first, then the generated tokens' entries as without echo:

- the prompt's log-probabilities are the target's, computed by the verifier in the pass that
  first feeds the prompt (``SamplingParams.prompt_logprobs``, ``cascade.core.verify.logprobs``), never
  by a drafter; they reach the gateway with the session's first round;
- each prompt token's entry (``gateway.openai.logprobs.prompt_entries``): its text decoded alone, its
  log-probability and ``top_logprobs`` (the N likeliest alternatives plus the token itself, as
  vLLM returns them), both null for the first token (nothing predicts it); ``text_offset``
  counts from the start of the echoed text.

``max_tokens`` 0 with echo (lm-evaluation-harness's loglikelihood requests: echo, max_tokens 0,
logprobs N) answers the prompt alone, finish_reason "length", completion_tokens 0. No layer
below the API generates 0 tokens (max_new_tokens is at least 1 on the wire, at both pods and in
the verifier's KV reservation), and the first round's pass is the one that scores the prompt
anyway, so the session generates one token, which the answer leaves out, as vLLM does: the
cost is that one round, and nothing below the API changes. Without echo, max_tokens 0 stays a
400.

Streamed, the first chunk carries the prompt's text (and log-probabilities) before the first
round's, as vLLM streams it. The stream's view (stored with the session) keeps the echoed text,
so a resumed stream (``gateway.resume``) is the rest of the original: the prompt again in front
of the first round's when the client has none of them, not at all after a round it has, and the
generated token of an echo of the prompt alone hidden (rounds replayed from Redis carry no
log-probabilities, the prompt's included).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

from gateway.openai.detokenize import Decoder
from gateway.openai.events import StreamView
from gateway.sessions.generation import GenerationFailed, GenerationRequest
from gateway.openai.logprobs import prompt_entries
from gateway.openai.streaming import Delta


@dataclass(frozen=True)
class EchoedPrompt:
    """What one choice echoes."""

    text: str
    """The prompt as sent, or its token ids decoded (special tokens kept)."""
    token_ids: list[int]
    is_alone: bool
    """max_tokens 0: the prompt is the whole answer (its one generated token is left out)."""
    with_logprobs: bool
    """The request asked for logprobs: the prompt's come first."""


def generated_max_tokens(body) -> int:
    """The session's max_tokens: 1 for an echo of the prompt alone (see the module docstring),
    else the request's."""
    return 1 if getattr(body, "echo", False) and body.max_tokens == 0 else body.max_tokens


def with_logprobs(request: GenerationRequest, body) -> GenerationRequest:
    """The request with the log-probabilities its body asked for (None: none): its tokens',
    and with echo the prompt's."""
    asked = body.requested_logprobs
    prompt = asked if getattr(body, "echo", False) else None
    return replace(request, sampling=replace(request.sampling, logprobs=asked,
                                             prompt_logprobs=prompt))


def echoed_prompt(body, prompt: str | list[int], token_ids: list[int], tokenizer: Decoder
                  ) -> EchoedPrompt | None:
    """What a choice of ``prompt`` echoes (None: the request did not ask)."""
    if not getattr(body, "echo", False):
        return None
    text = prompt if isinstance(prompt, str) else tokenizer.decode(token_ids,
                                                                   skip_special_tokens=False)
    return EchoedPrompt(text, token_ids, body.max_tokens == 0, body.logprobs is not None)


async def echoed(deltas: AsyncIterator[Delta], prompt: EchoedPrompt, tokenizer: Decoder
                 ) -> AsyncIterator[Delta]:
    """``deltas`` with the prompt (and its entries) in front of the first; for the prompt
    alone, the generated token's text, entries and count left out."""
    is_first = True
    async for delta in deltas:
        if prompt.is_alone:
            delta = replace(delta, text="", logprobs=(), completion_tokens=0, round=None,
                            finish_reason=delta.finish_reason and "length")
        if is_first:  # a long prompt's entries take a while: off the event loop
            scores = await asyncio.to_thread(_prompt_scores, prompt, delta, tokenizer)
            delta = replace(delta, text=prompt.text + delta.text,
                            logprobs=scores + delta.logprobs)
            is_first = False
        yield delta


def in_view(view: StreamView, prompt: EchoedPrompt | None) -> StreamView:
    """``view`` remembering what its stream echoes (a resumed stream echoes the same)."""
    if prompt is None:
        return view
    return replace(view, echo=prompt.text, echo_alone=prompt.is_alone)


def resumed(deltas: AsyncIterator[Delta], view: StreamView, seen_rounds: int,
            tokenizer: Decoder) -> AsyncIterator[Delta]:
    """A resumed stream's deltas echoed as the original's were: the prompt in front only when
    the client has no round (``seen_rounds`` 0)."""
    if view.echo is None:
        return deltas
    text = "" if seen_rounds else view.echo
    return echoed(deltas, EchoedPrompt(text, [], view.echo_alone, False), tokenizer)


def _prompt_scores(prompt: EchoedPrompt, first: Delta, tokenizer: Decoder):
    """The prompt's entries, from the first round's log-probabilities (none: not asked)."""
    if not prompt.with_logprobs:
        return ()
    if len(first.prompt_logprobs) != len(prompt.token_ids) - 1:
        raise GenerationFailed(f"The verifier returned {len(first.prompt_logprobs)} prompt "
                               f"log-probabilities for {len(prompt.token_ids) - 1} tokens.")
    return prompt_entries(prompt.token_ids, first.prompt_logprobs, tokenizer)

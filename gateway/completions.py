"""The completions and chat completions endpoints behind the HTTP app: a request's body to a
``GenerationRequest`` (tokenized, checked, the server's defaults applied), its choices run on the
``Generator``, and the reply streamed or collected (gateway.http_app wires the routes)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from functools import partial

import jinja2
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from transformers import PreTrainedTokenizerBase

from cascade.protocol.request.chat import chat_ids, has_chat_template
from cascade.protocol.limits import RequestInvalid
from cascade.protocol.request.prediction import with_prediction
from cascade.protocol.request.structured import with_grammar
from cascade.protocol.request.mapping import (
    GenerationRequest,
    build_request,
    check_vocabulary,
    with_bad_words,
)
from gateway.openai import choices
from gateway.openai import responses, schemas
from gateway.auth import ApiKeys
from gateway.openai.echo import (
    EchoedPrompt,
    echoed,
    echoed_prompt,
    generated_max_tokens,
    in_view,
    with_logprobs,
)
from gateway.openai.errors import APIError, bad_request, model_not_found
from gateway.sessions.generation import Generator
from gateway.settings import HttpSettings
from gateway.limits import KeyLimits, Slot
from gateway.openai.events import StreamView, Usage, events
from gateway.openai.streaming import Delta, EventStreamResponse, collect, text_deltas
from gateway.openai.tools import tool_calls_of, with_tools


def check_chat_template(tokenizer: PreTrainedTokenizerBase, model: str, instead: str) -> None:
    """400 naming 'messages' when the model has no chat template (``instead``: what to do)."""
    if not has_chat_template(tokenizer):
        raise bad_request(f"The model '{model}' has no chat template, so 'messages' cannot be "
                          f"formatted; {instead}.", param="messages")


def templated_ids(tokenizer: PreTrainedTokenizerBase, messages: list[dict],
                  tools: list[dict] | None = None, add_generation_prompt: bool = True
                  ) -> list[int]:
    """``chat_ids``, with what the template refuses as a 400 naming 'messages'."""
    try:
        return chat_ids(tokenizer, messages, tools, add_generation_prompt)
    except (jinja2.TemplateError, ValueError) as exc:
        raise bad_request(f"Invalid 'messages' for this model's chat template: {exc}",
                          "messages") from exc


class CompletionsApi:
    """Validates requests against the model's limits and turns them into generations."""

    def __init__(self, settings: HttpSettings, tokenizer: PreTrainedTokenizerBase,
                 generator: Generator, keys: ApiKeys, limits: KeyLimits) -> None:
        self.settings, self.tokenizer, self.generator = settings, tokenizer, generator
        self.server = settings.server_defaults(tokenizer.eos_token_id)
        self.keys, self.limits = keys, limits

    async def completions(self, body: schemas.CompletionRequest, http: Request) -> Response:
        self._check_model(body.model)
        return await self._reserved(http, self._completions, body)

    async def chat_completions(self, body: schemas.ChatCompletionRequest,
                               http: Request) -> Response:
        self._check_model(body.model)
        return await self._reserved(http, self._chat_completions, body)

    async def _reserved(self, http: Request, respond, body) -> Response:
        """``respond(body, http, caller, slot)`` holding a session slot of the caller's key
        (429 first when it is at its limit), given back if no response comes of it."""
        caller = self.keys.identity(http.headers.get("authorization"))
        slot = self.limits.reserve(caller)
        try:
            return await respond(body, http, caller, slot)
        except BaseException:
            slot.release()
            raise

    async def _completions(self, body: schemas.CompletionRequest, http: Request, caller: str,
                           slot: Slot) -> Response:
        # Mapping tokenizes the prompts and bad words and compiles a grammar, which takes a
        # while: off the event loop, which serves every stream (and /health), as gRPC does.
        requests, echoes = await asyncio.to_thread(self._completion_requests, body)
        return await self._respond("completion", body, http, caller, slot, requests, echoes)

    async def _chat_completions(self, body: schemas.ChatCompletionRequest, http: Request,
                                caller: str, slot: Slot) -> Response:
        request = await asyncio.to_thread(self._chat_request, body)  # off the loop, as above
        return await self._respond("chat", body, http, caller, slot, [request], [None])

    def _completion_requests(self, body: schemas.CompletionRequest
                             ) -> tuple[list[GenerationRequest], list[EchoedPrompt | None]]:
        """Each prompt's generation and what its choices echo (in a worker thread)."""
        prompts = [self._prompt_tokens(p) for p in body.prompt]
        requests = [with_logprobs(self._generation_request(
            body, ids, generated_max_tokens(body), "prompt"), body) for ids in prompts]
        echoes = [echoed_prompt(body, p, ids, self.tokenizer)
                  for p, ids in zip(body.prompt, prompts)]
        return requests, echoes

    def _chat_request(self, body: schemas.ChatCompletionRequest) -> GenerationRequest:
        """The conversation's generation (in a worker thread)."""
        prompt_tokens = self._apply_chat_template(body)
        max_tokens = body.requested_max_tokens
        max_field = "max_tokens" if body.max_completion_tokens is None else "max_completion_tokens"
        request = self._generation_request(body, prompt_tokens, max_tokens, "messages", max_field)
        return with_logprobs(request, body)

    async def _respond(self, kind: str, body: schemas.GenerationFields, http: Request,
                       caller: str, slot: Slot, requests: list[GenerationRequest],
                       echoes: list[EchoedPrompt | None]) -> Response:
        """One choice per request and n (gateway.openai.choices when there are several); ``echoes``:
        what each request's choices echo (gateway.openai.echo)."""
        count = getattr(body, "candidates", body.n)
        if len(requests) * count > schemas.MAX_CHOICES:
            name = "best_of" if count > body.n else "n"
            raise bad_request(f"Invalid value for '{name}': prompts times {name} must be at "
                              f"most {schemas.MAX_CHOICES}, got {len(requests)} x {count}.",
                              name)
        if len(requests) * count > 1:
            return await self._several(kind, body, http, caller, slot, requests, count, echoes)
        view = in_view(_view(kind, body, requests[0]), echoes[0])
        deltas = self._deltas(replace(requests[0], view=view.to_json(), caller=caller), body,
                              slot, echoes[0])
        if body.stream:
            return EventStreamResponse(events(view, deltas), on_close=slot.release)
        text, last = await _collect_while_connected(deltas, http, slot)
        response_format = responses.FORMATS[kind]
        choice = response_format.choice(text, last.finish_reason, 0,
                                        view.format_logprobs(last.logprobs),
                                        tool_calls_of(view.tools, text, last.finish_reason))
        return JSONResponse(responses.choices_response(view.meta, response_format, [choice],
                                                       view.usage.of(last)))

    async def _several(self, kind: str, body: schemas.GenerationFields, http: Request,
                       caller: str, slot: Slot, requests: list[GenerationRequest],
                       count: int, echoes: list[EchoedPrompt | None]) -> Response:
        """``count`` choices per request (n, or best_of's candidates)."""
        if count > body.n:  # best_of: every candidate's log-probabilities rank it
            requests = [choices.scored(r) for r in requests]
        each = choices.per_choice(requests, count)
        meta = responses.FORMATS[kind].meta(body.model)
        each_echo = [e for e in echoes for _ in range(count)]
        views = [in_view(v, e) for v, e in zip(choices.views(kind, meta, body, each), each_echo)]
        slots = [slot]
        try:
            for _ in each[1:]:
                slots.append(self.limits.reserve(caller))
            deltas = [self._deltas(replace(r, view=v.to_json(), caller=caller), body, s, e)
                      for r, v, s, e in zip(each, views, slots, each_echo)]
        except BaseException:
            for taken in slots[1:]:
                taken.release()
            raise
        prompts = [r.prompt_tokens for r in requests]
        if body.stream:
            events_ = choices.stream(kind, meta, views, deltas, body.include_usage,
                                     lambda lasts: choices.usage_of(prompts, lasts))
            return EventStreamResponse(events_, on_close=partial(_release, slots))
        results = await asyncio.gather(*[_collect_while_connected(d, http, s)
                                         for d, s in zip(deltas, slots)])
        usage_ = choices.usage_of(prompts, [last for _, last in results])
        if count > body.n:
            views, results = choices.best(views, list(results), count, body.n,
                                          body.requested_logprobs is not None)
        return JSONResponse(choices.response(kind, meta, views, list(results), usage_))

    def _prompt_tokens(self, prompt: str | list[int]) -> list[int]:
        """Token ids as given (each checked against the vocabulary), or the text tokenized."""
        if isinstance(prompt, list):
            vocab = len(self.tokenizer)
            bad = next((t for t in prompt if not 0 <= t < vocab), None)
            if bad is not None:
                raise bad_request(f"prompt: token id {bad} is outside the vocabulary "
                                  f"[0, {vocab}).", param="prompt")
            return list(prompt)
        return list(self.tokenizer(prompt).input_ids)

    def _deltas(self, request: GenerationRequest, body: schemas.GenerationFields,
                slot: Slot, prompt: EchoedPrompt | None = None) -> AsyncIterator[Delta]:
        """The request's deltas, its prompt charged and its max_tokens held first."""
        slot.hold(len(request.prompt_tokens), request.sampling.max_new_tokens)
        chunks = self.limits.counted(slot, self.generator.generate(request))
        deltas = text_deltas(chunks, self.tokenizer, body.stop, rounds=body.cascade_rounds)
        return deltas if prompt is None else echoed(deltas, prompt, self.tokenizer)

    def _word_ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False).input_ids

    def _check_model(self, model: str) -> None:
        if model != self.settings.model_name:
            raise model_not_found(model, self.settings.model_name)

    def _apply_chat_template(self, body: schemas.ChatCompletionRequest) -> list[int]:
        check_chat_template(self.tokenizer, self.settings.model_name,
                            "use /v1/completions with a prompt instead")
        tools = body.template_tools()
        messages = with_tools(body.template_messages(), tools, self.tokenizer.chat_template)
        return templated_ids(self.tokenizer, messages, tools)

    def _generation_request(
        self,
        body: schemas.GenerationFields,
        prompt_tokens: list[int],
        max_tokens: int | None,
        prompt_field: str,
        max_field: str = "max_tokens",
    ) -> GenerationRequest:
        """The one mapping's settings; 400 when the prompt or the completion cannot fit."""
        try:
            check_vocabulary(body, len(self.tokenizer))
            request = build_request(body, prompt_tokens, max_tokens, self.server, prompt_field,
                                    max_field)
            request = with_bad_words(request, body, self._word_ids)
            request = with_grammar(request, *(body.requested_grammar() or (None, "")))
            return with_prediction(request, body.prediction, self._word_ids,
                                   self.server.context_length, _not_with_prediction(body))
        except RequestInvalid as exc:
            raise bad_request(str(exc), exc.param, code=exc.code) from exc


def _not_with_prediction(body: schemas.GenerationFields) -> list[tuple[str, bool]]:
    """The request's fields a prediction cannot go with (as OpenAI refuses them), and
    whether each is set."""
    return [("n", body.n > 1), ("best_of", (getattr(body, "best_of", None) or 1) > 1),
            ("logprobs", body.requested_logprobs is not None),
            ("tools", bool(getattr(body, "tools", None)))]


def _view(kind: str, body: schemas.GenerationFields, request: GenerationRequest) -> StreamView:
    meta = responses.FORMATS[kind].meta(body.model)
    usage = Usage(len(request.prompt_tokens), not request.acceptance.rule.is_lossless,
                  request.draft.prediction)
    return StreamView(kind, meta, tuple(body.stop), body.include_usage, body.cascade_rounds,
                      usage, logprobs=request.sampling.logprobs is not None,
                      tools=getattr(body, "tool_names", ()))


CLIENT_CLOSED_REQUEST = 499
DISCONNECT_POLL_S = 0.25


async def _collect_while_connected(deltas: AsyncIterator[Delta], http: Request, slot: Slot):
    """``collect`` for a non-streamed reply, cancelled (and the session with it, recorded as
    cancelled) when the client disconnects: nobody would read the answer. The key's session
    slot is given back when it ends, however it ends."""
    task = asyncio.ensure_future(collect(deltas))
    task.add_done_callback(lambda _: slot.release())
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if not task.done() and await http.is_disconnected():
                task.cancel()
                raise APIError(CLIENT_CLOSED_REQUEST, "The client closed the request.",
                               code="client_closed_request")
        return task.result()
    finally:
        if not task.done():
            task.cancel()


def _release(slots: list[Slot]) -> None:
    for slot in slots:
        slot.release()

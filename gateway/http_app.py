"""The gateway's OpenAI-compatible HTTP API (completions, chat completions, models, probes).

Prompts are tokenized and outputs detokenized here, so the orchestrator behind ``Generator``
deals in token ids only. Every error reaches the client in OpenAI's shape (see gateway.errors).
"""

from __future__ import annotations

import inspect
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import jinja2
from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from transformers import PreTrainedTokenizerBase

from cascade.types import SamplingParams
from gateway import schemas
from gateway.errors import bad_request, install_error_handlers, model_not_found
from gateway.auth import ApiKeys, install_api_keys
from gateway.generation import GenerationRequest, Generator
from gateway.limits import RequestInvalid, fit_lengths
from gateway.streaming import Delta, EventStreamResponse, collect, generate_text, sse_event

ReadyCheck = Callable[[], bool | Awaitable[bool]]


@dataclass(frozen=True, kw_only=True)
class HttpSettings:
    """What the HTTP layer needs to know about the served model and its limits."""

    model_name: str
    """The one model served; requests naming another get 404 model_not_found."""
    context_length: int
    """The target model's context in tokens; prompt plus max_tokens must fit in it."""
    max_tokens_limit: int = 4096
    """Largest max_tokens a request may ask for (and the chat default when none is given)."""
    default_num_draft_tokens: int = 4
    """Drafted tokens per round when a request does not set num_draft_tokens."""
    api_keys: tuple[str, ...] = ()
    """Accepted bearer keys; empty leaves the API open (local use)."""

    def __post_init__(self) -> None:
        if self.context_length < 2:
            raise ValueError(f"context_length must be at least 2, got {self.context_length}")
        if self.max_tokens_limit < 1:
            raise ValueError(f"max_tokens_limit must be at least 1, got {self.max_tokens_limit}")
        if not 0 <= self.default_num_draft_tokens <= schemas.MAX_NUM_DRAFT_TOKENS:
            raise ValueError(
                f"default_num_draft_tokens must be in [0, {schemas.MAX_NUM_DRAFT_TOKENS}], "
                f"got {self.default_num_draft_tokens}"
            )


def create_app(
    settings: HttpSettings,
    tokenizer: PreTrainedTokenizerBase,
    generator: Generator,
    *,
    ready: ReadyCheck | None = None,
    registry: CollectorRegistry | None = None,
) -> FastAPI:
    """The FastAPI app; ``ready`` backs GET /ready, ``registry`` GET /metrics (default registry)."""
    app = FastAPI(title="Cascade gateway", version="0.1.0")
    install_error_handlers(app)
    install_api_keys(app, ApiKeys(settings.api_keys))
    api = _CompletionsApi(settings, tokenizer, generator)

    @app.post("/v1/completions")
    async def completions(body: schemas.CompletionRequest) -> Response:
        return await api.completions(body)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: schemas.ChatCompletionRequest) -> Response:
        return await api.chat_completions(body)

    _add_info_routes(app, settings, ready, registry)
    return app


def _add_info_routes(
    app: FastAPI,
    settings: HttpSettings,
    ready: ReadyCheck | None,
    registry: CollectorRegistry | None,
) -> None:
    """Model listing, liveness, readiness and Prometheus metrics."""
    created = int(time.time())

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return schemas.model_list(settings.model_name, created)

    @app.get("/v1/models/{model:path}")
    async def get_model(model: str) -> dict[str, Any]:
        if model != settings.model_name:
            raise model_not_found(model)
        return schemas.model_card(settings.model_name, created)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready")
    async def readiness() -> JSONResponse:
        ok = True if ready is None else ready()
        if inspect.isawaitable(ok):
            ok = await ok
        status = {"status": "ready" if ok else "not ready"}
        return JSONResponse(status, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry or REGISTRY), media_type=CONTENT_TYPE_LATEST)


class _CompletionsApi:
    """Validates requests against the model's limits and turns them into generations."""

    def __init__(
        self, settings: HttpSettings, tokenizer: PreTrainedTokenizerBase, generator: Generator
    ) -> None:
        self.settings = settings
        self.tokenizer = tokenizer
        self.generator = generator

    async def completions(self, body: schemas.CompletionRequest) -> Response:
        self._check_model(body.model)
        prompt_tokens = list(self.tokenizer(body.prompt).input_ids)
        request = self._generation_request(body, prompt_tokens, body.max_tokens, "prompt")
        meta = schemas.ResponseMeta.new("cmpl", body.model)
        deltas = generate_text(self.generator, request, self.tokenizer, body.stop)
        if body.stream:
            events = _completion_events(meta, deltas, len(prompt_tokens), body.include_usage)
            return EventStreamResponse(events)
        text, finish_reason, completion_tokens = await collect(deltas)
        usage = schemas.usage(len(prompt_tokens), completion_tokens)
        return JSONResponse(schemas.completion_response(meta, text, finish_reason, usage))

    async def chat_completions(self, body: schemas.ChatCompletionRequest) -> Response:
        self._check_model(body.model)
        prompt_tokens = self._apply_chat_template(body)
        max_tokens = body.requested_max_tokens
        request = self._generation_request(body, prompt_tokens, max_tokens, "messages")
        meta = schemas.ResponseMeta.new("chatcmpl", body.model)
        deltas = generate_text(self.generator, request, self.tokenizer, body.stop)
        if body.stream:
            events = _chat_events(meta, deltas, len(prompt_tokens), body.include_usage)
            return EventStreamResponse(events)
        text, finish_reason, completion_tokens = await collect(deltas)
        usage = schemas.usage(len(prompt_tokens), completion_tokens)
        return JSONResponse(schemas.chat_response(meta, text, finish_reason, usage))

    def _check_model(self, model: str) -> None:
        if model != self.settings.model_name:
            raise model_not_found(model)

    def _apply_chat_template(self, body: schemas.ChatCompletionRequest) -> list[int]:
        if not getattr(self.tokenizer, "chat_template", None):
            raise bad_request(
                f"The model '{self.settings.model_name}' has no chat template, so 'messages' "
                "cannot be formatted; use /v1/completions with a prompt instead.",
                param="messages",
            )
        try:
            # Control tokens inside message contents stay plain text: users cannot forge turns.
            token_ids = self.tokenizer.apply_chat_template(
                body.template_messages(),
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
                sanitize_control_tokens=True,
            )
        except (jinja2.TemplateError, ValueError) as exc:
            message = f"Invalid 'messages' for this model's chat template: {exc}"
            raise bad_request(message, "messages") from exc
        return list(token_ids)

    def _generation_request(
        self,
        body: schemas.GenerationFields,
        prompt_tokens: list[int],
        max_tokens: int | None,
        prompt_field: str,
    ) -> GenerationRequest:
        max_new_tokens = self._check_lengths(len(prompt_tokens), max_tokens, prompt_field)
        eos = self.tokenizer.eos_token_id
        sampling = SamplingParams(
            temperature=body.temperature,
            top_k=body.top_k,
            top_p=body.top_p,
            seed=secrets.randbits(63) if body.seed is None else body.seed % 2**64,
            max_new_tokens=max_new_tokens,
            stop_token_ids=(eos,) if eos is not None else (),
        )
        num_draft = body.num_draft_tokens
        if num_draft is None:
            num_draft = self.settings.default_num_draft_tokens
        return GenerationRequest(prompt_tokens, sampling, num_draft_tokens=num_draft,
                                 draft_method=body.draft_method)

    def _check_lengths(self, num_prompt: int, max_tokens: int | None, prompt_field: str) -> int:
        """The max_new_tokens to use; 400 when the prompt or the completion cannot fit."""
        try:
            return fit_lengths(num_prompt, max_tokens, self.settings.context_length,
                               self.settings.max_tokens_limit, prompt_field)
        except RequestInvalid as exc:
            raise bad_request(str(exc), exc.param, code=exc.code) from exc


async def _completion_events(
    meta: schemas.ResponseMeta, deltas: AsyncIterator[Delta], num_prompt: int, include_usage: bool
) -> AsyncIterator[str]:
    async for delta in deltas:
        if delta.text or delta.finish_reason:
            chunk = schemas.completion_chunk(meta, delta.text, delta.finish_reason, include_usage)
            yield sse_event(chunk)
        if delta.finish_reason and include_usage:
            usage = schemas.usage(num_prompt, delta.completion_tokens)
            yield sse_event(schemas.usage_chunk(meta, "text_completion", usage))


async def _chat_events(
    meta: schemas.ResponseMeta, deltas: AsyncIterator[Delta], num_prompt: int, include_usage: bool
) -> AsyncIterator[str]:
    first = True
    async for delta in deltas:
        if first:  # sent with the first generated chunk, so errors before it still get a status
            role = {"role": "assistant", "content": ""}
            yield sse_event(schemas.chat_chunk(meta, role, None, include_usage))
            first = False
        if delta.text:
            content = {"content": delta.text}
            yield sse_event(schemas.chat_chunk(meta, content, None, include_usage))
        if delta.finish_reason:
            yield sse_event(schemas.chat_chunk(meta, {}, delta.finish_reason, include_usage))
            if include_usage:
                usage = schemas.usage(num_prompt, delta.completion_tokens)
                yield sse_event(schemas.usage_chunk(meta, "chat.completion.chunk", usage))

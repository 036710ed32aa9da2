"""The gateway's OpenAI-compatible HTTP API (completions, chat completions, models, probes).

Prompts are tokenized and outputs detokenized here, so the orchestrator behind ``Generator``
deals in token ids only. Every error reaches the client in OpenAI's shape (see gateway.openai.errors).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from transformers import PreTrainedTokenizerBase

from cascade.serving import metrics
from gateway.openai import responses, schemas
from gateway.auth import ApiKeys, install_api_keys
from gateway.completions import CompletionsApi
from gateway.settings import HttpSettings
from gateway.openai.errors import install_error_handlers, model_not_found
from gateway.sessions.generation import Generator
from gateway.limits import BodyLimit, KeyLimits
from gateway.playground import install_playground, page_settings
from gateway.resume import install_resume
from gateway.tokenizer_api import install_tokenizer_routes

ReadyCheck = Callable[[], bool | Awaitable[bool]]
ServingFacts = Callable[[], Awaitable[dict[str, Any]]]
"""What the live verifiers serve the model in (e.g. ``{"dtype": "bfloat16"}``), for
/v1/models."""


def create_app(
    settings: HttpSettings,
    tokenizer: PreTrainedTokenizerBase,
    generator: Generator,
    *,
    ready: ReadyCheck | None = None,
    registry: CollectorRegistry | None = None,
    limits: KeyLimits | None = None,
    serving: ServingFacts | None = None,
) -> FastAPI:
    """The FastAPI app; ``ready`` backs GET /ready, ``registry`` GET /metrics (default: the
    gateway's, every sample labelled with the served model's name),
    ``limits`` the per-key limits it shares with the gateway's gRPC API (by default its own,
    from ``settings``), ``serving`` what /v1/models says of the serving pods."""
    app = FastAPI(title="Cascade gateway", version="0.1.0")
    install_error_handlers(app)
    keys = ApiKeys(settings.api_keys)
    install_api_keys(app, keys)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    limits = limits or KeyLimits(settings.max_sessions_per_key,
                                 settings.tokens_per_minute_per_key)
    api = CompletionsApi(settings, tokenizer, generator, keys, limits)

    @app.post("/v1/completions")
    async def completions(body: schemas.CompletionRequest, request: Request) -> Response:
        return await api.completions(body, request)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: schemas.ChatCompletionRequest, request: Request) -> Response:
        return await api.chat_completions(body, request)

    install_resume(app, tokenizer, generator, keys, limits)
    install_tokenizer_routes(app, settings, tokenizer)
    _add_info_routes(app, settings, ready, registry, serving)
    if settings.playground:
        install_playground(app, page_settings(settings.model_name,
                                              settings.num_draft_tokens,
                                              settings.max_tokens_limit,
                                              settings.draft_method))
    return app


def _add_info_routes(
    app: FastAPI,
    settings: HttpSettings,
    ready: ReadyCheck | None,
    registry: CollectorRegistry | None,
    serving: ServingFacts | None,
) -> None:
    """Model listing, liveness, readiness and Prometheus metrics."""
    created = int(time.time())
    exposed = registry or metrics.Labelled(metrics.GATEWAY, model_name=settings.model_name)

    async def card() -> dict[str, Any]:
        facts = await serving() if serving else {}
        return responses.model_card(settings.model_name, created, settings.context_length, facts)

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [await card()]}

    @app.get("/v1/models/{model:path}")
    async def get_model(model: str) -> dict[str, Any]:
        if model != settings.model_name:
            raise model_not_found(model, settings.model_name)
        return await card()

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
    async def prometheus_metrics() -> Response:
        return Response(generate_latest(exposed), media_type=CONTENT_TYPE_LATEST)

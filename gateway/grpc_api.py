"""The gateway's gRPC Generate stream: tokenize, map the request (the HTTP API's one mapping),
run it through the orchestrator, stream each round's text."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

from cascade.protocol.request.chat import chat_prompt_ids, has_chat_template
from cascade.protocol.grammar import Grammar
from cascade.protocol.limits import RequestInvalid, shortened
from cascade.protocol.request.prediction import prediction_usage, with_prediction
from cascade.protocol.request.mapping import (
    GenerationRequest,
    ServerDefaults,
    build_request,
    check_vocabulary,
    with_bad_words,
)
from cascade.protocol.request.options import GenerationOptions, validate_options
from cascade.protocol.settings import FinishReason
from cascade.protocol.limits import MAX_LOGPROBS
from cascade.protocol.request.structured import with_grammar
from cascade.protocol.wire.convert import FINISH_TO_PB, grammar_from_pb, logprobs_to_pb
from cascade.serving.errors import NotFound, Unauthenticated
from cascade.v1 import gateway_pb2, gateway_pb2_grpc
from gateway.auth import ApiKeys
from gateway.openai.detokenize import TextStream
from gateway.sessions.generation import ResumableGenerator, stop_early
from gateway.limits import KeyLimits
from gateway.sessions.session_store import SessionLost

REQUEST_FIELDS = ("model", "prompt", "chat", "max_tokens", "logprobs", "prompt_logprobs",
                  "structured_output")
"""GenerateRequest fields the servicer reads itself; every other field is a generation option
of the same name (``GenerationOptions``; ``tests/test_protos.py`` keeps the two equal)."""


def options_fields(msg: gateway_pb2.GenerateRequest) -> dict[str, Any]:
    """The generation options a request sets, by name (an unset optional field, an empty
    string, list or map: the default)."""
    fields: dict[str, Any] = {}
    for name in GenerationOptions.model_fields:
        field, value = msg.DESCRIPTOR.fields_by_name[name], getattr(msg, name)
        if field.has_presence:
            if msg.HasField(name):
                fields[name] = value
        elif value:
            fields[name] = _plain(field, value)
    if "prediction" in fields:
        fields["prediction"] = {"type": "content", "content": msg.prediction}
    return fields


def _plain(field, value) -> Any:
    """A repeated or map field's value as a list or dict (scalars as they are)."""
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        return dict(value)
    return list(value) if field.is_repeated else value


def _grammar(msg: gateway_pb2.GenerateRequest) -> Grammar | None:
    """The request's structured output (None: free text)."""
    if not msg.HasField("structured_output"):
        return None
    try:
        return grammar_from_pb(msg.structured_output)
    except ValueError as exc:
        raise RequestInvalid(f"Invalid value for 'structured_output': {exc}.",
                             "structured_output") from exc


class GatewayServicer(gateway_pb2_grpc.GatewayServicer):
    def __init__(self, tokenizer, generator: ResumableGenerator, model_name: str, server: ServerDefaults,
                 api_keys: ApiKeys = ApiKeys(()), limits: KeyLimits | None = None,
                 max_prompt_bytes: int = 1 << 20) -> None:
        self.tokenizer, self.generator, self.api_keys = tokenizer, generator, api_keys
        self.model_name, self.server = model_name, server
        self.limits = limits or KeyLimits()
        self.max_prompt_bytes = max_prompt_bytes

    def _request(self, msg: gateway_pb2.GenerateRequest) -> tuple[GenerationRequest, list[str]]:
        """The generation and its stop strings; RequestInvalid (INVALID_ARGUMENT) says what to
        fix, with the same message the HTTP API gives."""
        if msg.model and msg.model != self.model_name:
            raise RequestInvalid(f"Invalid value for 'model': the model "
                                 f"'{shortened(msg.model)}' does not "
                                 f"exist; use '{self.model_name}'.", "model",
                                 code="model_not_found")
        options = validate_options(options_fields(msg))
        check_vocabulary(options, len(self.tokenizer))
        if len(msg.prompt) > self.max_prompt_bytes:  # characters: at least as many bytes
            raise RequestInvalid(f"Invalid 'prompt': longer than {self.max_prompt_bytes} bytes, "
                                 "this gateway's limit; send a shorter prompt.", "prompt",
                                 code="request_too_large")
        prompt = self._tokenize(msg.prompt, msg.chat)
        max_tokens = msg.max_tokens if msg.HasField("max_tokens") else None
        request = with_bad_words(build_request(options, prompt, max_tokens, self.server),
                                 options, self._word_ids)
        request = with_grammar(request, _grammar(msg), "structured_output")
        request = with_prediction(request, options.prediction, self._word_ids,
                                  self.server.context_length,
                                  [("logprobs", msg.HasField("logprobs"))])
        for name in ("logprobs", "prompt_logprobs"):
            if not msg.HasField(name):
                continue
            if getattr(msg, name) > MAX_LOGPROBS:
                raise RequestInvalid(f"Invalid value for '{name}': must be in [0, "
                                     f"{MAX_LOGPROBS}], got {getattr(msg, name)}.", name)
            request = replace(request, sampling=replace(request.sampling,
                                                        **{name: getattr(msg, name)}))
        return request, options.stop

    def _word_ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False).input_ids

    def _tokenize(self, text: str, chat: bool) -> list[int]:
        if not chat:
            return self.tokenizer(text).input_ids
        if not has_chat_template(self.tokenizer):
            raise RequestInvalid("The model has no chat template; send chat = false.", "chat")
        return chat_prompt_ids(self.tokenizer, text)

    def _authorized_key(self, context) -> str:
        """The caller's key identity (UNAUTHENTICATED without a valid key)."""
        authorization = dict(context.invocation_metadata() or ()).get("authorization")
        if not self.api_keys.allows(authorization):
            raise Unauthenticated("invalid or missing API key: send metadata "
                                  "'authorization: Bearer <key>'")
        return self.api_keys.identity(authorization)

    async def Generate(self, request, context):
        key = self._authorized_key(context)
        slot = self.limits.reserve(key)
        try:
            # Tokenizing a long prompt takes a while: off the event loop, which serves every
            # stream.
            generation, stops = await asyncio.to_thread(self._request, request)
            generation = replace(generation, caller=key,
                                 view=json.dumps({"kind": "grpc", "stop": stops}))
            slot.hold(len(generation.prompt_tokens), generation.sampling.max_new_tokens)
            chunks = self.limits.counted(slot, self.generator.generate(generation))
            shown = (generation.prompt_tokens if generation.sampling.prompt_logprobs is not None
                     else None)
            async for response in self._responses(chunks, stops, len(generation.prompt_tokens),
                                                  prompt=shown,
                                                  prediction=generation.draft.prediction):
                yield response
        finally:
            slot.release()

    async def Resume(self, request, context):
        key = self._authorized_key(context)
        if not request.session_id:
            raise RequestInvalid("Invalid 'session_id': required.", "session_id")
        slot = self.limits.reserve(key)  # a resumed stream counts like a new one
        try:
            try:
                generation, chunks = await self.generator.resume(request.session_id, key,
                                                                 request.after_round)
            except SessionLost as exc:  # HTTP answers 404 session_not_found
                raise NotFound(f"session_id: {exc}") from exc
            stops = json.loads(generation.view or "{}").get("stop", [])
            async for response in self._responses(self.limits.counted(slot, chunks), stops,
                                                  len(generation.prompt_tokens),
                                                  request.after_round,
                                                  prediction=generation.draft.prediction):
                yield response
        finally:
            slot.release()

    async def _responses(self, chunks, stops: list[str], num_prompt: int, seen_rounds: int = 0,
                         prompt: list[int] | None = None, prediction: tuple[int, ...] = ()):
        """One response per chunk; chunks of rounds up to ``seen_rounds`` (which a resuming
        client has) only advance the text. ``prompt``: the prompt's ids, sent with its
        log-probabilities in the first response (the request asked for them; a resumed
        stream does not send them again: they are not stored). ``prediction``: the request's
        predicted output, whose kept and lost tokens the last response counts."""
        text, ids = TextStream(self.tokenizer, stops=stops), []
        try:
            async for chunk in chunks:
                final, before = chunk.finish_reason is not None, text.num_tokens
                accepted = text.add(chunk.token_ids[: chunk.stats.num_accepted])
                chosen = text.add(chunk.token_ids[chunk.stats.num_accepted :], final=final)
                finish = FinishReason.STOP if text.stopped else chunk.finish_reason
                if text.stopped:
                    chunk = _cut(chunk, text.num_tokens - before)
                if prediction:
                    ids += chunk.token_ids
                if not 0 < chunk.round <= seen_rounds:  # else the client has it (the final too)
                    response = self._response(chunk, accepted, chosen, finish, num_prompt,
                                              text.num_tokens)
                    if prediction and (final or text.stopped):
                        for name, count in prediction_usage(prediction, ids).items():
                            setattr(response, name, count)
                    if prompt is not None:
                        response.prompt_token_ids.extend(prompt)
                        response.prompt_logprobs.extend(logprobs_to_pb(chunk.prompt_logprobs))
                        prompt = None
                    yield response
                if text.stopped:  # a stop string ended the text: the rest is not wanted
                    await stop_early(chunks)
                    return
        finally:
            await chunks.aclose()

    @staticmethod
    def _response(chunk, accepted: str, chosen: str, finish, num_prompt: int,
                  completion_tokens: int) -> gateway_pb2.GenerateResponse:
        return gateway_pb2.GenerateResponse(
            session_id=chunk.session_id, text=accepted + chosen, accepted_text=accepted,
            token_ids=chunk.token_ids, finish_reason=FINISH_TO_PB[finish],
            prompt_tokens=num_prompt, completion_tokens=completion_tokens, round=chunk.round,
            logprobs=logprobs_to_pb(chunk.logprobs),
            stats=None if chunk.is_replayed else chunk.stats.to_pb(), **_tree_fields(chunk))


def _cut(chunk, num_tokens: int):
    """The chunk's first ``num_tokens`` (a stop string ended the generation at the last of
    them: what followed in the round is not part of it)."""
    return replace(chunk, token_ids=chunk.token_ids[:num_tokens],
                   logprobs=chunk.logprobs[:num_tokens],
                   stats=replace(chunk.stats,
                                 num_accepted=min(chunk.stats.num_accepted, num_tokens)))


def _tree_fields(chunk) -> dict[str, Any]:
    """A token tree round's nodes and accepted path (nothing for a chain)."""
    if not chunk.drafted_parents:
        return {}
    return {"drafted_tokens": chunk.drafted_tokens, "drafted_parents": chunk.drafted_parents,
            "path": chunk.path}

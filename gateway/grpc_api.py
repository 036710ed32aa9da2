"""The gateway's gRPC Generate stream: tokenize, validate, run through the orchestrator."""

from __future__ import annotations

import secrets

from cascade.chat import chat_prompt_ids
from cascade.drafting import MAX_DRAFT_TOKENS
from cascade.serving.errors import Unauthenticated
from cascade.types import SamplingParams
from cascade.v1 import gateway_pb2, gateway_pb2_grpc
from cascade.wire import FINISH_TO_PB, METHOD_FROM_PB
from gateway.auth import ApiKeys
from gateway.detokenize import TextStream
from gateway.generation import GenerationRequest, Generator
from gateway.limits import fit_lengths


class GatewayServicer(gateway_pb2_grpc.GatewayServicer):
    def __init__(self, tokenizer, generator: Generator, model_name: str, context_length: int,
                 default_num_draft_tokens: int, api_keys: ApiKeys = ApiKeys(())) -> None:
        self.tokenizer, self.generator, self.api_keys = tokenizer, generator, api_keys
        self.model_name, self.context_length = model_name, context_length
        self.default_k = default_num_draft_tokens

    def _request(self, msg: gateway_pb2.GenerateRequest) -> GenerationRequest:
        if msg.model and msg.model != self.model_name:
            raise ValueError(f"model {msg.model!r} is not served; use {self.model_name!r}")
        prompt = self._tokenize(msg.prompt, msg.chat)
        s = msg.sampling
        max_new_tokens = fit_lengths(len(prompt), s.max_new_tokens or None, self.context_length,
                                     self.context_length, max_field="sampling.max_new_tokens")
        k = msg.num_draft_tokens if msg.HasField("num_draft_tokens") else self.default_k
        if k > MAX_DRAFT_TOKENS:
            raise ValueError(f"num_draft_tokens must be in [0, {MAX_DRAFT_TOKENS}], got {k}")
        eos = self.tokenizer.eos_token_id
        params = SamplingParams(
            temperature=s.temperature, top_k=s.top_k, top_p=s.top_p or 1.0,
            seed=s.seed or secrets.randbits(63), max_new_tokens=max_new_tokens,
            stop_token_ids=tuple(s.stop_token_ids) or ((eos,) if eos is not None else ()))
        return GenerationRequest(prompt, params, k, METHOD_FROM_PB[msg.draft_method])

    def _tokenize(self, text: str, chat: bool) -> list[int]:
        if not chat:
            return self.tokenizer(text).input_ids
        if not self.tokenizer.chat_template:
            raise ValueError("the model has no chat template; send chat = false")
        return chat_prompt_ids(self.tokenizer, text)

    async def Generate(self, request, context):
        metadata = dict(context.invocation_metadata() or ())
        if not self.api_keys.allows(metadata.get("authorization")):
            raise Unauthenticated("invalid or missing API key: send metadata "
                                  "'authorization: Bearer <key>'")
        generation = self._request(request)
        text = TextStream(self.tokenizer, stops=())
        completion_tokens = 0
        async for chunk in self.generator.generate(generation):
            completion_tokens += len(chunk.token_ids)
            accepted = text.add(chunk.token_ids[: chunk.num_accepted])
            chosen = text.add(chunk.token_ids[chunk.num_accepted :],
                              final=chunk.finish_reason is not None)
            yield gateway_pb2.GenerateResponse(
                session_id=chunk.session_id, text=accepted + chosen, accepted_text=accepted,
                token_ids=chunk.token_ids, num_accepted=chunk.num_accepted,
                num_drafted=chunk.num_drafted, finish_reason=FINISH_TO_PB[chunk.finish_reason],
                prompt_tokens=len(generation.prompt_tokens), completion_tokens=completion_tokens,
                draft_us=chunk.draft_us, verify_us=chunk.verify_us, round_us=chunk.round_us)



"""vLLM's tokenizer endpoints, for clients that keep no copy of the model folder: ``POST
/tokenize`` (a prompt, or chat messages through the chat template), ``POST /detokenize``,
``GET /tokenizer_info`` (the special tokens and the chat template: what lm-evaluation-harness's
``remote`` tokenizer backend reads) and ``GET /version``. Same shapes as vLLM's; the served
model's own fast tokenizer, the one every request is encoded with."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import Field
from transformers import PreTrainedTokenizerBase

import cascade
from cascade.protocol.request.options import Lenient
from gateway.completions import check_chat_template, templated_ids
from gateway.openai.errors import bad_request, model_not_found
from gateway.settings import HttpSettings
from gateway.openai.schemas import ChatMessage, template_messages


class TokenizeRequest(Lenient):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None
    """Default: True for a prompt, False for messages (the template adds its own), as vLLM."""
    add_generation_prompt: bool = True
    """Messages: open the assistant's turn after them."""
    return_token_strs: bool = False


class DetokenizeRequest(Lenient):
    model: str | None = None
    tokens: list[int] = Field(max_length=1 << 20)


def install_tokenizer_routes(app: FastAPI, settings: HttpSettings,
                             tokenizer: PreTrainedTokenizerBase) -> None:
    def check(model: str | None) -> None:
        if model is not None and model != settings.model_name:
            raise model_not_found(model, settings.model_name)

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        check(body.model)
        tokens = _encoded(body, tokenizer, settings.model_name)
        strs = tokenizer.convert_ids_to_tokens(tokens) if body.return_token_strs else None
        return {"count": len(tokens), "max_model_len": settings.context_length,
                "tokens": tokens, "token_strs": strs}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict[str, Any]:
        check(body.model)
        bad = next((t for t in body.tokens if not 0 <= t < len(tokenizer)), None)
        if bad is not None:
            raise bad_request(f"Token id {bad} is outside the vocabulary [0, {len(tokenizer)}).",
                              param="tokens")
        return {"prompt": tokenizer.decode(body.tokens)}

    @app.get("/tokenizer_info")
    async def tokenizer_info() -> dict[str, Any]:
        return {"tokenizer_class": type(tokenizer).__name__,
                "model_max_length": settings.context_length, "vocab_size": len(tokenizer),
                **{name: getattr(tokenizer, name, None)
                   for name in ("bos_token", "eos_token", "pad_token", "unk_token")},
                "chat_template": getattr(tokenizer, "chat_template", None)}

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": cascade.__version__}


def _encoded(body: TokenizeRequest, tokenizer: PreTrainedTokenizerBase, model: str
             ) -> list[int]:
    if (body.prompt is None) == (body.messages is None):
        raise bad_request("Give exactly one of 'prompt' and 'messages'.", param="prompt")
    if body.prompt is not None:
        special = True if body.add_special_tokens is None else body.add_special_tokens
        return tokenizer(body.prompt, add_special_tokens=special).input_ids
    check_chat_template(tokenizer, model, "send a 'prompt' instead")
    tokens = templated_ids(tokenizer, template_messages(body.messages or []),
                           add_generation_prompt=body.add_generation_prompt)
    if body.add_special_tokens and tokenizer.bos_token_id is not None and (
            not tokens or tokens[0] != tokenizer.bos_token_id):
        tokens = [tokenizer.bos_token_id] + tokens
    return tokens

"""A scripted generator and HTTP helpers for testing the gateway's OpenAI-compatible layer with
a tiny real tokenizer."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import openai

from cascade.protocol.settings import FinishReason
from cascade.protocol.round_stats import RoundStats
from gateway.sessions.generation import GeneratedChunk, GenerationRequest, StopGeneration
from gateway.http_app import create_app
from gateway.settings import HttpSettings

MODEL = "tiny-model"
SETTINGS = HttpSettings(model_name=MODEL, context_length=64, max_tokens_limit=32)
OUTPUT = "Hello world, naïve café 日本語 and the quick brown fox."


class FakeGenerator:
    """Yields scripted token chunks, records requests, and notes whether it was closed early."""

    def __init__(self, chunks: list[list[int]], finish: FinishReason = FinishReason.LENGTH,
                 error: Exception | None = None, error_at: int = 0, delay: float = 0.0) -> None:
        self.chunks, self.finish, self.delay = chunks, finish, delay
        self.error, self.error_at = error, error_at
        self.requests: list[GenerationRequest] = []
        self.yielded = 0
        self.closed_early = False
        self.stopped = False
        """The consumer ended the stream on purpose (StopGeneration thrown in)."""
        self.completed = False

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GeneratedChunk]:
        self.requests.append(request)
        try:
            for i, ids in enumerate(self.chunks):
                if self.error is not None and i == self.error_at:
                    raise self.error
                last = i == len(self.chunks) - 1
                if self.delay:
                    await asyncio.sleep(self.delay)
                self.yielded += 1
                stats = RoundStats(num_accepted=len(ids) - 1, num_drafted=3, draft_us=1500,
                                   verify_us=2500, round_us=4200,
                                   speculation=2 + self.yielded % 2)
                yield GeneratedChunk("s-1", ids, self.finish if last else None, stats,
                                     drafted_tokens=drafted_block(ids, 3))
            self.completed = True
        except StopGeneration:
            self.stopped = True
        except (GeneratorExit, asyncio.CancelledError):
            self.closed_early = True
            raise

    @property
    def request(self) -> GenerationRequest:
        assert len(self.requests) == 1
        return self.requests[0]


REJECTED_TOKEN = 7
"""Stands for the drafted tokens the scripted verifier rejected."""


def drafted_block(ids: list[int], num_drafted: int) -> tuple[int, ...]:
    """A block whose first len(ids) - 1 tokens are the accepted ones."""
    accepted = tuple(ids[:len(ids) - 1])
    return (accepted + (REJECTED_TOKEN,) * num_drafted)[:num_drafted]


def script(tokenizer, text: str, per_chunk: int = 3, eos: bool = False) -> list[list[int]]:
    ids = tokenizer(text).input_ids + ([tokenizer.eos_token_id] if eos else [])
    return [ids[i:i + per_chunk] for i in range(0, len(ids), per_chunk)]


def make_client(tokenizer, generator, settings: HttpSettings = SETTINGS,
                **app_kwargs) -> httpx.AsyncClient:
    app = create_app(settings, tokenizer, generator, **app_kwargs)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


def make_openai(http: httpx.AsyncClient) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url="http://test/v1", api_key="x", http_client=http,
                              max_retries=0)


def parse_sse(body: str) -> list[str]:
    """The data of each event, asserting OpenAI's exact framing (only data lines, [DONE] last)."""
    assert body.endswith("data: [DONE]\n\n"), body[-80:]
    events = body.split("\n\n")
    assert events[-1] == ""
    datas = []
    for event in events[:-1]:
        assert event.startswith("data: ") and "\n" not in event, repr(event)
        datas.append(event[len("data: "):])
    assert datas[-1] == "[DONE]" and "[DONE]" not in datas[:-1]
    return datas[:-1]


async def stream_post(
    http: httpx.AsyncClient, path: str, body: dict
) -> tuple[httpx.Response, list[dict]]:
    response = await http.post(path, json=body)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    return response, [json.loads(data) for data in parse_sse(response.text)]


# ----- completions --------------------------------------------------------------------------

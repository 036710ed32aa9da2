"""Malformed and extreme bodies against the gateway's OpenAI-compatible HTTP API (the real
FastAPI app with a tiny real tokenizer, in process): never a 5xx; every 4xx is OpenAI's error
shape naming the offending field (``error.param``, or the body itself when it is not a
request); a refused request never reaches the generator (the orchestrator, the only writer to
Redis); a valid one reaches it once per choice."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from gateway.http_app import create_app
from gateway_requests import HTTP_SETTINGS, Body, RecordingGenerator, request_bodies
from harness import SLOW_EXAMPLES_SCALE, run_fuzz

EXAMPLES_PER_ENDPOINT = 500
ENDPOINTS = ("/v1/completions", "/v1/chat/completions")


class Api:
    """The app under test and the generator behind it."""

    def __init__(self, tokenizer) -> None:
        self.generator = RecordingGenerator(tokenizer("Hello world").input_ids, len(tokenizer))
        self.client = TestClient(create_app(HTTP_SETTINGS, tokenizer, self.generator),
                                 raise_server_exceptions=False)


@pytest.fixture(scope="module")
def api(tokenizer):
    app = Api(tokenizer)
    with app.client:
        yield app


def param_root(param: str) -> str:
    """"messages[0].content" -> "messages"; "stream_options.include_usage" -> "stream_options"."""
    return param.split("[")[0].split(".")[0]


def assert_error_names_field(status: int, error: dict, body: Body) -> None:
    message, param = error["message"], error.get("param")
    assert isinstance(message, str) and message, error
    if body.broken is None or param is None:
        assert param or "request body" in message, f"{status}: no field named: {error}"
        return
    assert param_root(param) in body.broken, f"{status} names {param!r}, broken: {body.broken}"


def check_endpoint(api: Api, path: str, body: Body) -> None:
    asked = len(api.generator.requests)
    response = api.client.post(path, content=body.raw,
                               headers={"content-type": "application/json"})
    assert response.status_code < 500, (response.status_code, response.text[:300], body)
    reached = len(api.generator.requests) - asked
    if response.status_code == 200:
        assert reached == choices_in(response.text)  # one session per choice (n, prompts)
        return
    assert 400 <= response.status_code < 500 and reached == 0, (response.status_code, reached)
    assert body.broken != frozenset(), f"a valid request was refused: {response.text} {body}"
    assert_error_names_field(response.status_code, json.loads(response.text)["error"], body)


def choices_in(text: str) -> int:
    """How many choices a response (whole, or a stream of chunks) holds."""
    if text.startswith("{"):
        return len(json.loads(text)["choices"])
    chunks = [json.loads(line[6:]) for line in text.splitlines()
              if line.startswith("data: {")]
    return len({choice["index"] for chunk in chunks for choice in chunk["choices"]})


def fuzz_endpoint(api: Api, path: str, examples: int) -> None:
    sent = run_fuzz(request_bodies(path), lambda body: check_endpoint(api, path, body), examples)
    assert sent == examples


@pytest.mark.parametrize("path", ENDPOINTS)
def test_http_answers_malformed_requests_with_a_named_4xx(api, path):
    fuzz_endpoint(api, path, EXAMPLES_PER_ENDPOINT)


@pytest.mark.slow
@pytest.mark.parametrize("path", ENDPOINTS)
def test_http_long_fuzz(api, path):
    fuzz_endpoint(api, path, EXAMPLES_PER_ENDPOINT * SLOW_EXAMPLES_SCALE)

"""Draft-length options on the HTTP API: mapped into the DraftConfig the drafter gets (through
the wire too), and refused with the field named when out of range."""

from __future__ import annotations

import pytest

from cascade.protocol.wire.convert import draft_settings_from_pb, draft_settings_to_pb
from http_fixtures import MODEL, FakeGenerator, make_client, script
from server_defaults import server_defaults


async def post(tokenizer, extra: dict):
    generator = FakeGenerator(script(tokenizer, "ok"))
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 4, **extra}
    async with make_client(tokenizer, generator) as http:
        response = await http.post("/v1/completions", json=body)
    return response, generator


async def test_adaptive_schedule_and_stops_reach_the_draft_config(tokenizer):
    response, generator = await post(tokenizer, {
        "draft_schedule": "adaptive", "draft_min_confidence": 0.2, "draft_max_entropy": 3.5,
        "num_draft_tokens": 5})
    assert response.status_code == 200, response.text
    draft = generator.request.draft
    assert (draft.adaptive, draft.min_confidence, draft.max_entropy) == (True, 0.2, 3.5)
    assert draft.adaptive_bounds == (1, 10)
    back = draft_settings_from_pb(draft_settings_to_pb(draft))  # float32 on the wire
    assert back.adaptive and back.num_draft_tokens == 5
    assert (back.min_confidence, back.max_entropy) == (pytest.approx(0.2), 3.5)


async def test_fixed_is_the_default(tokenizer):
    _, generator = await post(tokenizer, {})
    draft = generator.request.draft
    assert (draft.adaptive, draft.min_confidence, draft.max_entropy) == (False, 0.0, 0.0)


@pytest.mark.parametrize("extra, param", [
    ({"draft_schedule": "sometimes"}, "draft_schedule"),
    ({"draft_schedule": "adaptive", "draft_method": "ngram"}, "draft_schedule"),
    ({"draft_min_confidence": 1.0}, "draft_min_confidence"),
    ({"draft_max_entropy": -1}, "draft_max_entropy"),
    ({"draft_max_entropy": 1e9}, "draft_max_entropy"),
])
async def test_bad_draft_options_name_the_field(tokenizer, extra, param):
    response, generator = await post(tokenizer, extra)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param
    assert not generator.requests


@pytest.mark.parametrize("extra, method", [
    ({}, "suffix_then_model"),  # the server's default
    ({"draft_method": "ngram"}, "ngram"),  # the request's own
    ({"acceptance": "cascade"}, "model"),  # needs the model's q: the model
    ({"acceptance": "recursive", "temperature": 0.7}, "model"),
    ({"draft_schedule": "adaptive"}, "model"),
])
def test_the_servers_default_method_where_the_request_can_use_it(extra, method):
    from cascade.protocol.request.mapping import build_request
    from gateway.openai.schemas import CompletionRequest

    server = server_defaults(64, draft_method="suffix_then_model")
    body = CompletionRequest(model=MODEL, prompt="Hi", max_tokens=4, **extra)
    assert build_request(body, [1, 2], 4, server, "prompt").draft.method == method


def test_an_unknown_default_method_is_refused():
    from dataclasses import replace

    with pytest.raises(ValueError, match="default_draft_method"):
        replace(server_defaults(64), default_draft_method="telepathy")


@pytest.mark.parametrize(("extra", "rule"), [
    ({"temperature": 0.8, "seed": 7}, "keyed"),  # a seed reproduces the text by default
    ({"temperature": 0.8, "seed": 0}, "keyed"),  # zero is a seed too
    ({"temperature": 0.8}, "speculative"),  # unseeded: plain speculative sampling
    ({"temperature": 0, "seed": 7}, "greedy"),
    ({"temperature": 0.8, "seed": 7, "acceptance": "recursive"}, "recursive"),
    ({"temperature": 0.8, "seed": 7, "acceptance": "cascade"}, "chow"),
])
def test_a_seeded_sampled_request_is_verified_with_the_keyed_rule(extra, rule):
    from cascade.protocol.request.mapping import build_request
    from gateway.openai.schemas import CompletionRequest

    body = CompletionRequest(model=MODEL, prompt="Hi", max_tokens=4, **extra)
    policy = build_request(body, [1, 2], 4, server_defaults(64), "prompt").acceptance
    assert policy.rule.value == rule

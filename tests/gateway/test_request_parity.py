"""One mapping, both front ends: the same request through HTTP and through gRPC (a real server on
loopback) gives the same settings, and the same bad request the same message (400 / INVALID_ARGUMENT)."""

from dataclasses import MISSING, fields, replace

import grpc
import pytest

from cascade.protocol.request.mapping import ServerDefaults
from cascade.v1 import gateway_pb2
from http_fixtures import MODEL, SETTINGS

SAME = [  # fields as the HTTP API names them; gRPC has the same names
    {"max_tokens": 5, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "seed": 7,
     "num_draft_tokens": 2, "draft_method": "ngram_then_model"},
    {"max_tokens": 3, "temperature": 0.0, "seed": 0},
    {"max_tokens": 9, "temperature": 1.3, "seed": 11, "num_draft_tokens": 0, "stop": ["x"]},
    {"max_tokens": 6, "temperature": 0.0, "seed": 5, "stop_token_ids": [5, 17]},
    {"max_tokens": 4, "temperature": 0.7, "seed": 2, "logit_bias": {"5": -100.0, "17": 3.5},
     "min_tokens": 2, "presence_penalty": 0.5, "frequency_penalty": -0.25,
     "repetition_penalty": 1.25, "bad_words": ["hello", "big world"]},
    {"max_tokens": 4, "temperature": 0.0, "seed": 3, "acceptance": "cascade",
     "cascade_rule": "token_v2",
     "cascade_alpha": 0.25},
]
BAD = [
    {"max_tokens": 5, "temperature": 2.5},
    {"max_tokens": 5, "top_p": 0.0},
    {"max_tokens": 5, "num_draft_tokens": 33},
    {"max_tokens": 5, "draft_method": "telepathy"},
    {"max_tokens": 5, "top_k": 2**31},
    {"max_tokens": 500},
    {"max_tokens": 40},  # prompt + completion exceed the 64-token context
    {"max_tokens": 5, "acceptance": "fast"},
    {"max_tokens": 5, "acceptance": "cascade", "cascade_rule": "best"},
    {"max_tokens": 5, "acceptance": "cascade", "cascade_alpha": 1.5},
    {"max_tokens": 5, "acceptance": "cascade", "draft_method": "ngram"},
    {"max_tokens": 5, "stop_token_ids": [10**6]},
    {"max_tokens": 5, "stop_token_ids": list(range(16))},
    {"max_tokens": 5, "logit_bias": {"x": 1.0}},
    {"max_tokens": 5, "presence_penalty": 2.5},
    {"max_tokens": 5, "bad_words": ["w"] * 33},
    {"max_tokens": 5, "repetition_penalty": 0.0},
    {"max_tokens": 5, "logit_bias": {"5": 101.0}},
    {"max_tokens": 5, "logit_bias": {"1000000": 1.0}},
    {"max_tokens": 5, "logit_bias": {"\u00b2": 1.0}},
    {"max_tokens": 5, "min_tokens": 6},
    {"max_tokens": 5, "min_tokens": 2**32 - 1},
    {"max_tokens": 5, "top_p": 1e-50},  # what the wire's float32 makes of these: 0, 0, 1
    {"max_tokens": 5, "repetition_penalty": 1e-50},
    {"max_tokens": 5, "draft_min_confidence": 0.99999999},
]
PROMPT = "Hello world " * 6


async def _grpc(stub, fields: dict):
    request = gateway_pb2.GenerateRequest(model=MODEL, prompt=PROMPT, **fields)
    return [response async for response in stub.Generate(request, timeout=10)]


@pytest.mark.parametrize("fields", SAME)
async def test_the_same_request_gives_the_same_settings(both, fields):
    http, stub, http_generator, grpc_generator = both
    response = await http.post("/v1/completions",
                               json={"model": MODEL, "prompt": PROMPT, **fields})
    assert response.status_code == 200, response.text
    await _grpc(stub, fields)
    # the same generation; only how each API presents its stream (the view) differs
    assert replace(http_generator.request, view="") == replace(grpc_generator.request, view="")


@pytest.mark.parametrize("fields", BAD)
async def test_the_same_bad_request_gets_the_same_message(both, fields):
    http, stub, _, grpc_generator = both
    response = await http.post("/v1/completions",
                               json={"model": MODEL, "prompt": PROMPT, **fields})
    assert response.status_code == 400
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _grpc(stub, fields)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == response.json()["error"]["message"]
    assert not grpc_generator.requests  # refused before anything ran


def test_the_request_defaults_are_declared_once_in_the_gateway_flags():
    assert all(f.default is MISSING for f in fields(ServerDefaults))  # carried, not declared
    defaults = SETTINGS.server_defaults(7)
    assert (defaults.context_length, defaults.max_tokens_limit,
            defaults.default_num_draft_tokens, defaults.eos_token_id,
            defaults.default_tree_nodes, defaults.default_draft_method) == (
        SETTINGS.context_length, SETTINGS.max_tokens_limit, SETTINGS.num_draft_tokens, 7,
        SETTINGS.tree_nodes, SETTINGS.draft_method)


def test_a_tiny_positive_temperature_is_greedy_and_the_core_refuses_it_raw():
    """1e-40 used to give NaN probabilities (k = 0: the last vocabulary id every round)."""
    from cascade.protocol.request.options import validate_options
    from cascade.protocol.settings import SamplingParams

    assert validate_options({"temperature": 1e-40}).temperature == 0.0
    assert validate_options({"temperature": 1e-5}).temperature == 1e-5
    with pytest.raises(ValueError, match="temperature must be 0"):
        SamplingParams(temperature=1e-40)


@pytest.mark.parametrize("temperature", [1e-5, 1.0000001e-5, 0.7, 2.0])
def test_a_temperature_the_gateway_accepts_survives_the_wires_float32(temperature):
    """The proto carries temperature as float32: 1e-5 arrives as 9.99999975e-6, which the
    pods must accept too (they used to refuse it as below the minimum)."""
    from cascade.protocol.request.options import validate_options
    from cascade.protocol.settings import SamplingParams
    from cascade.protocol.wire.convert import sampling_from_pb, sampling_to_pb

    accepted = validate_options({"temperature": temperature}).temperature
    params = SamplingParams(temperature=accepted, seed=1)
    assert sampling_from_pb(sampling_to_pb(params)).temperature > 0

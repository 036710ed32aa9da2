"""Predicted Outputs at the gateway: the prediction reaches the drafting settings from HTTP and
gRPC alike, is refused where OpenAI refuses it (naming the field), and the usage says how much
of it the completion kept."""


import grpc
import pytest

from cascade.protocol.request.prediction import prediction_usage
from cascade.v1 import gateway_pb2
from http_fixtures import (
    MODEL,
    OUTPUT,
    SETTINGS,
    FakeGenerator,
    make_client,
    script,
    stream_post,
)

PROMPT = "Hello world " * 3
PREDICTED = "Hello world, naïve café and the slow brown fox."


def _ids(tokenizer, text: str) -> tuple[int, ...]:
    return tuple(tokenizer(text, add_special_tokens=False).input_ids)


@pytest.mark.parametrize("content", [PREDICTED, [{"type": "text", "text": PREDICTED[:20]},
                                                 {"type": "text", "text": PREDICTED[20:]}]])
async def test_the_prediction_reaches_the_drafter_settings_from_both_apis(both, tokenizer,
                                                                          content):
    http, stub, http_generator, grpc_generator = both
    response = await http.post("/v1/completions", json={
        "model": MODEL, "prompt": PROMPT, "max_tokens": 8,
        "prediction": {"type": "content", "content": content}})
    assert response.status_code == 200, response.text
    request = gateway_pb2.GenerateRequest(model=MODEL, prompt=PROMPT, max_tokens=8,
                                          prediction=PREDICTED)
    [r async for r in stub.Generate(request, timeout=10)]
    assert http_generator.request.draft.prediction == _ids(tokenizer, PREDICTED)
    assert grpc_generator.request.draft == http_generator.request.draft
    assert http_generator.request.draft.method == "auto"


REFUSED = [  # (path, fields, the field the error names)
    ("/v1/completions", {"n": 2}, "prediction"),
    ("/v1/completions", {"best_of": 2}, "prediction"),
    ("/v1/completions", {"logprobs": 1}, "prediction"),
    ("/v1/completions", {"presence_penalty": 0.5}, "prediction"),
    ("/v1/completions", {"frequency_penalty": 0.1}, "prediction"),
    ("/v1/completions", {"draft_method": "model"}, "draft_method"),
    ("/v1/completions", {"acceptance": "cascade"}, "draft_method"),
    ("/v1/chat/completions", {"logprobs": True}, "prediction"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {}}}}]}, "prediction"),
]


@pytest.mark.parametrize(("path", "fields", "param"), REFUSED)
async def test_a_prediction_is_refused_where_openai_refuses_it(tokenizer, path, fields, param):
    generator = FakeGenerator(script(tokenizer, "ok"))
    body = {"model": MODEL, "max_tokens": 8, **fields,
            "prediction": {"type": "content", "content": PREDICTED}}
    body |= ({"prompt": PROMPT} if path == "/v1/completions"
             else {"messages": [{"role": "user", "content": PROMPT}]})
    roomy = SETTINGS.model_copy(update={"context_length": 1024})  # the tools' schema fits
    async with make_client(tokenizer, generator, roomy) as http:
        response = await http.post(path, json=body)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == param, response.text
        assert not generator.requests
        del body["prediction"]  # the same request without it is fine
        assert (await http.post(path, json=body)).status_code == 200


@pytest.mark.parametrize("prediction", [{"type": "image", "content": "x"},
                                        {"type": "content", "content": 5},
                                        {"type": "content", "content": [{"text": "x"}]},
                                        {"type": "content", "content": "x", "extra": 1}])
async def test_a_malformed_prediction_is_a_400(tokenizer, prediction):
    async with make_client(tokenizer, FakeGenerator(script(tokenizer, "ok"))) as http:
        response = await http.post("/v1/completions", json={
            "model": MODEL, "prompt": PROMPT, "max_tokens": 8, "prediction": prediction})
    assert response.status_code == 400
    assert "prediction" in response.json()["error"]["message"]


async def test_grpc_refuses_a_prediction_with_logprobs(both):
    _, stub, _, grpc_generator = both
    request = gateway_pb2.GenerateRequest(model=MODEL, prompt=PROMPT, max_tokens=8,
                                          prediction=PREDICTED, logprobs=1)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        [r async for r in stub.Generate(request, timeout=10)]
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "prediction" in info.value.details()
    assert not grpc_generator.requests


def test_the_usage_counts_the_predictions_tokens_kept_in_order():
    assert prediction_usage([1, 2, 3, 4], [1, 2, 3, 4]) == {
        "accepted_prediction_tokens": 4, "rejected_prediction_tokens": 0}
    assert prediction_usage([1, 2, 3, 4, 5, 6], [1, 2, 9, 9, 5, 6, 7]) == {
        "accepted_prediction_tokens": 4, "rejected_prediction_tokens": 2}
    assert prediction_usage([4, 3, 2, 1], [1, 2, 3, 4]) == {
        "accepted_prediction_tokens": 1, "rejected_prediction_tokens": 3}
    assert prediction_usage([], [1]) == {
        "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}


@pytest.mark.parametrize("stream", [False, True])
async def test_the_usage_reports_accepted_and_rejected_prediction_tokens(tokenizer, stream):
    generator = FakeGenerator(script(tokenizer, OUTPUT))
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 30,
            "prediction": {"type": "content", "content": PREDICTED}}
    async with make_client(tokenizer, generator) as http:
        if stream:
            _, chunks = await stream_post(http, "/v1/chat/completions", {
                **body, "stream": True, "stream_options": {"include_usage": True}})
            usage = chunks[-1]["usage"]
        else:
            response = await http.post("/v1/chat/completions", json=body)
            assert response.status_code == 200, response.text
            usage = response.json()["usage"]
        plain = (await http.post("/v1/chat/completions", json={
            k: v for k, v in body.items() if k != "prediction"})).json()["usage"]
    completion = [t for chunk in script(tokenizer, OUTPUT) for t in chunk]
    assert usage["completion_tokens_details"] == prediction_usage(_ids(tokenizer, PREDICTED),
                                                                  completion)
    details = usage["completion_tokens_details"]
    assert 0 < details["accepted_prediction_tokens"] < len(_ids(tokenizer, PREDICTED))
    assert "completion_tokens_details" not in plain

"""Predicted Outputs through the whole cluster (gateway, drafter and verifier pods, real Redis),
with the default drafting: the output is the target's greedy decoding whatever the prediction
(right, wrong, empty, edited), a right prediction is what the rounds draft from, and the official
client reads the usage's prediction counts."""

import json

import httpx
import openai
import pytest

from cluster_expectations import clear_sessions, expected_tokens

PROMPT = "def main():"
MAX_TOKENS = 24


async def _streamed(http: httpx.AsyncClient, prediction: str) -> tuple[str, dict[str, int]]:
    """(text, accepted tokens by what drafted them) of one greedy streamed completion."""
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0,
            "stream": True, "cascade_rounds": True,
            "prediction": {"type": "content", "content": prediction}}
    text, accepted = [], {}
    async with http.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            text += [c["text"] for c in chunk["choices"]]
            rounds = chunk.get("cascade")
            if rounds:
                source = rounds.get("draft_source") or "none"
                accepted[source] = accepted.get(source, 0) + rounds["num_accepted"]
    return "".join(text), accepted


@pytest.mark.parametrize("kind", ["right", "empty", "wrong", "edited"])
async def test_the_output_is_the_targets_whatever_the_prediction(cluster, kind):
    tokenizer = cluster.target.tokenizer
    expected = tokenizer.decode(expected_tokens(cluster, PROMPT, MAX_TOKENS),
                                skip_special_tokens=True)
    half = len(expected) // 2
    prediction = {"right": expected, "empty": "", "wrong": "zq " * 20,
                  "edited": expected[:half] + "XYZ" + expected[half + 3:]}[kind]
    async with httpx.AsyncClient(base_url=cluster.http_url, timeout=60) as http:
        await clear_sessions(cluster)
        text, accepted = await _streamed(http, prediction)
    assert text == expected
    if kind == "right":
        assert accepted.get("prediction", 0) >= MAX_TOKENS // 2, accepted


async def test_the_official_client_sends_a_prediction_and_reads_its_usage(cluster):
    client = openai.AsyncOpenAI(base_url=f"{cluster.http_url}/v1", api_key="unused")
    args = dict(model="tiny", messages=[{"role": "user", "content": "Write a loop."}],
                max_tokens=MAX_TOKENS, temperature=0)
    plain = await client.chat.completions.create(**args)
    answer = plain.choices[0].message.content
    predicted = await client.chat.completions.create(
        **args, prediction={"type": "content", "content": answer})
    assert predicted.choices[0].message.content == answer
    details = predicted.usage.completion_tokens_details
    # a random tiny model's tokens need not be the tokenizer's own split of their text, so
    # how many match varies; together they are the prediction's tokens
    tokenizer = cluster.target.tokenizer
    assert (details.accepted_prediction_tokens + details.rejected_prediction_tokens
            == len(tokenizer(answer, add_special_tokens=False).input_ids))
    assert plain.usage.completion_tokens_details is None
    with pytest.raises(openai.BadRequestError, match="prediction"):
        await client.chat.completions.create(
            **args, n=2, prediction={"type": "content", "content": answer})
    await client.close()


async def test_grpc_reports_the_predictions_kept_and_lost_tokens_on_the_last_response(cluster):
    """The gRPC API's last response counts the prediction's tokens as the HTTP usage does;
    earlier responses leave the counts at 0."""
    import grpc

    from cascade.protocol.request.prediction import prediction_usage
    from cascade.v1 import gateway_pb2, gateway_pb2_grpc

    tokenizer = cluster.target.tokenizer
    expected = tokenizer.decode(expected_tokens(cluster, PROMPT, MAX_TOKENS),
                                skip_special_tokens=True)
    prediction = expected[: len(expected) // 2] + " zq zq zq"
    request = gateway_pb2.GenerateRequest(prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0,
                                          chat=False, prediction=prediction)
    async with grpc.aio.insecure_channel(cluster.grpc_address) as channel:
        responses = [r async for r in gateway_pb2_grpc.GatewayStub(channel).Generate(
            request, timeout=60)]
    ids = [t for r in responses for t in r.token_ids]
    predicted = tokenizer(prediction, add_special_tokens=False).input_ids
    counts = prediction_usage(predicted, ids)
    last = responses[-1]
    assert (last.accepted_prediction_tokens, last.rejected_prediction_tokens) == (
        counts["accepted_prediction_tokens"], counts["rejected_prediction_tokens"])
    assert last.accepted_prediction_tokens + last.rejected_prediction_tokens == len(predicted)
    assert last.accepted_prediction_tokens > 0
    assert not any(r.accepted_prediction_tokens or r.rejected_prediction_tokens
                   for r in responses[:-1])

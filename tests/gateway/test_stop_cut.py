"""A stop string ends the generation at the token that completes it: usage counts the tokens up
to and including that one, log-probabilities cover the same tokens, and best_of ranks its
candidates on them, so none of these depend on how many tokens the last round committed (k, the
plan, load)."""

from __future__ import annotations

import json

import pytest

from cascade.protocol.logprobs import TokenLogprobs
from server_defaults import server_defaults
from cascade.protocol.settings import FinishReason
from cascade.protocol.round_stats import RoundStats
from cascade.v1 import gateway_pb2
from gateway.openai.detokenize import TextStream
from gateway.sessions.generation import GeneratedChunk, StopGeneration
from gateway.grpc_api import GatewayServicer

from http_fixtures import MODEL, OUTPUT, make_client

STOP = "café"


def completing(tokenizer, stop: str) -> int:
    """How many of OUTPUT's tokens it takes for the decoded text to hold ``stop``."""
    ids = tokenizer(OUTPUT).input_ids
    return next(n for n in range(len(ids) + 1) if stop in tokenizer.decode(ids[:n]))


class RoundGenerator:
    """Commits OUTPUT's tokens in rounds of k + 1 (a chain whose drafts are all accepted), each
    token with a log-probability: ``scores[seed]`` before the stop string's last token and
    ``after[seed]`` after it."""

    def __init__(self, tokenizer, scores: dict[int, float], after: dict[int, float]) -> None:
        self.ids = tokenizer(OUTPUT).input_ids
        self.end = completing(tokenizer, STOP)
        self.scores, self.after = scores, after

    async def generate(self, request):
        step, seed = request.num_draft_tokens + 1, request.sampling.seed
        logprobs = [self.scores[seed] if i < self.end else self.after[seed]
                    for i in range(len(self.ids))]
        try:
            for start in range(0, len(self.ids), step):
                tokens = self.ids[start:start + step]
                last = start + step >= len(self.ids)
                yield GeneratedChunk(
                    "s-1", tokens, FinishReason.LENGTH if last else None,
                    RoundStats(num_accepted=len(tokens) - 1, num_drafted=step - 1),
                    round=start // step + 1,
                    logprobs=tuple(TokenLogprobs(v) for v in logprobs[start:start + step]))
        except StopGeneration:
            pass


@pytest.mark.parametrize("stop", [STOP, "日本", "fox", "."])
def test_text_stream_counts_tokens_up_to_the_one_completing_a_stop(tokenizer, stop):
    ids = tokenizer(OUTPUT).input_ids
    for size in range(1, 7):
        text = TextStream(tokenizer, ["zzz", stop])
        visible = "".join(text.add(ids[i:i + size], final=i + size >= len(ids))
                          for i in range(0, len(ids), size))
        assert visible == OUTPUT[:OUTPUT.index(stop)] and text.stopped
        assert text.num_tokens == completing(tokenizer, stop), f"rounds of {size}"


def test_text_stream_counts_every_token_without_a_stop(tokenizer):
    ids = tokenizer(OUTPUT).input_ids
    text = TextStream(tokenizer, ["zzz"])
    assert text.add(ids[:5]) + text.add(ids[5:], final=True) == OUTPUT
    assert text.num_tokens == len(ids) and not text.stopped


@pytest.mark.parametrize("stream", [False, True])
async def test_usage_and_logprobs_after_a_stop_do_not_depend_on_k(tokenizer, stream):
    generator = RoundGenerator(tokenizer, {1: -0.5}, {1: -9.0})
    answers = []
    async with make_client(tokenizer, generator) as http:
        for k in (1, 4):
            body = {"model": MODEL, "prompt": "Hi", "max_tokens": 30, "stop": [STOP],
                    "logprobs": 1, "seed": 1, "num_draft_tokens": k, "stream": stream,
                    "stream_options": {"include_usage": True}}
            response = await http.post("/v1/completions", json=body)
            answers.append(_usage_and_logprobs(response))
    assert answers[0] == answers[1]
    usage, logprobs = answers[0]
    assert usage["completion_tokens"] == generator.end
    assert logprobs == [-0.5] * generator.end


async def test_best_of_ranks_on_the_tokens_up_to_the_stop(tokenizer):
    # Seed 1 scores better up to the stop; seed 2 would win with the tokens after it.
    generator = RoundGenerator(tokenizer, {1: -1.0, 2: -1.1}, {1: -5.0, 2: 0.0})
    async with make_client(tokenizer, generator) as http:
        for k in (1, 4):
            result = (await http.post("/v1/completions", json={
                "model": MODEL, "prompt": "Hi", "max_tokens": 30, "stop": [STOP], "seed": 1,
                "best_of": 2, "logprobs": 1, "num_draft_tokens": k})).json()
            choice = result["choices"][0]
            assert choice["logprobs"]["token_logprobs"] == [-1.0] * generator.end, f"k={k}"
            assert result["usage"]["completion_tokens"] == 2 * generator.end


async def test_grpc_usage_and_logprobs_after_a_stop_do_not_depend_on_k(tokenizer):
    generator = RoundGenerator(tokenizer, {1: -0.5}, {1: -9.0})
    servicer = GatewayServicer(tokenizer, generator, MODEL, server_defaults(
        64, tokenizer.eos_token_id, max_tokens_limit=30))
    answers = []
    for k in (1, 4):
        request = gateway_pb2.GenerateRequest(prompt="Hi", max_tokens=30, stop=[STOP],
                                              seed=1, num_draft_tokens=k, logprobs=1)
        responses = [r async for r in servicer.Generate(request, _Context())]
        answers.append((responses[-1].completion_tokens,
                        [lp.logprob for r in responses for lp in r.logprobs],
                        [t for r in responses for t in r.token_ids]))
    assert answers[0] == answers[1] == (generator.end, [-0.5] * generator.end,
                                        generator.ids[:generator.end])


def _usage_and_logprobs(response) -> tuple[dict, list[float]]:
    """OpenAI's usage counts (without ``cascade``: what speculation did depends on k) and the
    token log-probabilities."""
    assert response.status_code == 200, response.text
    if not response.headers["content-type"].startswith("text/event-stream"):
        result = response.json()
        result["usage"].pop("cascade")
        return result["usage"], result["choices"][0]["logprobs"]["token_logprobs"]
    events = [json.loads(line[6:]) for line in response.text.splitlines()
              if line.startswith("data: {")]
    logprobs = [v for e in events for c in e["choices"] if c.get("logprobs")
                for v in c["logprobs"]["token_logprobs"]]
    events[-1]["usage"].pop("cascade")
    return events[-1]["usage"], logprobs


class _Context:
    """The part of a gRPC servicer context Generate reads (no API keys are configured)."""

    def invocation_metadata(self):
        return ()

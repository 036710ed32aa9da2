"""The default real pair (SmolLM2-135M-Instruct + its distilled drafter) through the services:
greedy output equals the target's own greedy decoding."""

import os
from pathlib import Path

import httpx
import pytest

from cascade.tools.pairs import DEFAULT_DRAFTER, default_models_dir
from cascade.core.model.runner import ModelRunner, ModelSpec
from conftest import running_cluster
from models import hf_greedy

DRAFTER = Path(os.environ.get("CASCADE_TEST_DRAFTER", DEFAULT_DRAFTER))
PROMPTS = ["What is gravity?", "Write a Python function to reverse a string."]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def real_pair():
    from cascade.tools.smollm import prepare

    target_dir = prepare(default_models_dir())
    target = ModelRunner.load(ModelSpec(str(target_dir)))
    return target_dir, target, ModelRunner.load(ModelSpec(str(DRAFTER)))


async def test_real_pair_greedy_through_http_equals_target_greedy(redis_server, real_pair):
    target_dir, target, drafter = real_pair
    expected = {prompt: _greedy_text(target, prompt) for prompt in PROMPTS}  # before it serves
    async with running_cluster(redis_server.url, target_dir, target, drafter, "smollm2") as c:
        async with httpx.AsyncClient(base_url=c.http_url, timeout=120) as http:
            for prompt in PROMPTS:
                messages = [{"role": "user", "content": prompt}]
                body = {"model": "smollm2", "messages": messages, "max_tokens": MAX_TOKENS,
                        "temperature": 0, "num_draft_tokens": 4}
                response = await http.post("/v1/chat/completions", json=body)
                assert response.status_code == 200, response.text
                assert response.json()["choices"][0]["message"]["content"] == expected[prompt]


def _greedy_text(target, prompt: str) -> str:
    """The target's own greedy reply, computed outside the cluster's event loop: a reference
    decode inside it would block the pods' heartbeats past their registry expiry."""
    tokenizer = target.tokenizer
    ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                        add_generation_prompt=True, tokenize=True,
                                        return_dict=False)
    expected = hf_greedy(target, ids, MAX_TOKENS)
    if tokenizer.eos_token_id in expected:
        expected = expected[: expected.index(tokenizer.eos_token_id) + 1]
    return tokenizer.decode(expected, skip_special_tokens=True)


PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 30},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "city": {"type": "string", "maxLength": 30}},
    "required": ["name", "age", "city"], "additionalProperties": False}


@pytest.mark.slow
@pytest.mark.parametrize("draft", [{"num_draft_tokens": 0}, {"num_draft_tokens": 4},
                                   {"num_draft_tokens": 4, "draft_tree_nodes": 8}],
                         ids=["target-alone", "chains", "trees"])
async def test_real_pair_json_schema_equals_masked_target_greedy(redis_server, real_pair, draft):
    """SmolLM2 writes a JSON object under a schema through the services: the target's greedy
    decoding under the same mask, token for token, and it validates."""
    import json

    import jsonschema

    from cascade.protocol.request.chat import chat_ids
    from cascade.protocol.grammar import Grammar
    from grammar_reference import masked_greedy

    target_dir, target, drafter = real_pair
    messages = [{"role": "user", "content": "Describe a person as JSON: name, age, city."}]
    reference = masked_greedy(target, chat_ids(target.tokenizer, messages),
                              Grammar.json_schema(PERSON), 80)
    async with running_cluster(redis_server.url, target_dir, target, drafter, "smollm2") as c:
        async with httpx.AsyncClient(base_url=c.http_url, timeout=120) as http:
            response = await http.post("/v1/chat/completions", json={
                "model": "smollm2", "messages": messages, "max_tokens": 80, "temperature": 0,
                "draft_schedule": "fixed", **draft,
                "response_format": {"type": "json_schema",
                                    "json_schema": {"name": "person", "schema": PERSON}}})
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["content"] == target.tokenizer.decode(reference,
                                                                   skip_special_tokens=True)
    jsonschema.validate(json.loads(choice["message"]["content"]), PERSON)

"""vLLM's tokenizer endpoints on the gateway, with a tiny real tokenizer: the same ids every
request is encoded with, back to the same text, and the information a remote-tokenizer client
(lm-evaluation-harness's ``remote`` backend) reads."""

import copy

from cascade.protocol.request.chat import chat_ids
from http_fixtures import MODEL, SETTINGS, FakeGenerator, make_client

TEXT = "Hello world, naïve café"
MESSAGES = [{"role": "user", "content": "Hi there"}]


async def test_a_prompt_is_tokenized_and_detokenized_back(tokenizer):
    async with make_client(tokenizer, FakeGenerator([])) as http:
        tokens = (await http.post("/tokenize", json={"model": MODEL, "prompt": TEXT,
                                                     "return_token_strs": True})).json()
        plain = (await http.post("/tokenize", json={"prompt": TEXT,
                                                    "add_special_tokens": False})).json()
        text = (await http.post("/detokenize", json={"tokens": plain["tokens"]})).json()
    assert tokens["tokens"] == tokenizer(TEXT).input_ids and tokens["count"] == len(
        tokens["tokens"])
    assert tokens["max_model_len"] == SETTINGS.context_length
    assert tokens["token_strs"] == tokenizer.convert_ids_to_tokens(tokens["tokens"])
    assert plain["tokens"] == tokenizer(TEXT, add_special_tokens=False).input_ids
    assert plain["token_strs"] is None and text == {"prompt": TEXT}


async def test_messages_go_through_the_chat_template(tokenizer):
    async with make_client(tokenizer, FakeGenerator([])) as http:
        opened = (await http.post("/tokenize", json={"messages": MESSAGES})).json()
        closed = (await http.post("/tokenize", json={"messages": MESSAGES,
                                                     "add_generation_prompt": False})).json()
    assert opened["tokens"] == chat_ids(tokenizer, MESSAGES)
    assert closed["tokens"] == chat_ids(tokenizer, MESSAGES, add_generation_prompt=False)
    assert opened["tokens"] != closed["tokens"]


async def test_tokenizer_info_and_version(tokenizer):
    async with make_client(tokenizer, FakeGenerator([])) as http:
        info = (await http.get("/tokenizer_info")).json()
        version = (await http.get("/version")).json()
    assert info["eos_token"] == tokenizer.eos_token and info["vocab_size"] == len(tokenizer)
    assert info["chat_template"] == tokenizer.chat_template
    assert info["model_max_length"] == SETTINGS.context_length
    assert version["version"]


async def test_bad_tokenizer_requests_are_400s_and_404s_that_say_what_to_fix(tokenizer):
    plain = copy.deepcopy(tokenizer)
    plain.chat_template = None
    async with make_client(tokenizer, FakeGenerator([])) as http:
        both = await http.post("/tokenize", json={"prompt": TEXT, "messages": MESSAGES})
        neither = await http.post("/tokenize", json={"model": MODEL})
        other = await http.post("/tokenize", json={"model": "other", "prompt": TEXT})
        outside = await http.post("/detokenize", json={"tokens": [1, len(tokenizer)]})
    async with make_client(plain, FakeGenerator([])) as http:
        untemplated = await http.post("/tokenize", json={"messages": MESSAGES})
    assert both.status_code == neither.status_code == 400
    assert "exactly one of 'prompt' and 'messages'" in both.json()["error"]["message"]
    assert other.status_code == 404 and other.json()["error"]["code"] == "model_not_found"
    assert outside.status_code == 400 and outside.json()["error"]["param"] == "tokens"
    assert untemplated.status_code == 400 and untemplated.json()["error"]["param"] == "messages"

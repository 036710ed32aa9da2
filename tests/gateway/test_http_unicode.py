"""Text that is not valid Unicode (a lone surrogate, as JSON allows "\\ud800") is refused with a
400 naming the field, never a 500, and nothing is generated for it."""

import pytest

from http_fixtures import MODEL, FakeGenerator, make_client, script



@pytest.mark.parametrize("path, body, field", [
    ("/v1/completions", '{"model": "%s", "prompt": "a\\ud800b"}', "prompt"),
    ("/v1/chat/completions",
     '{"model": "%s", "messages": [{"role": "user", "content": "\\udfff"}]}', "messages"),
    ("/v1/completions", '{"model": "%s", "prompt": "ok", "stop": ["\\ud800"]}', "stop"),
])
async def test_lone_surrogates_are_a_400_naming_the_field(tokenizer, path, body, field):
    generator = FakeGenerator(script(tokenizer, "ok"))
    async with make_client(tokenizer, generator) as http:
        response = await http.post(path, content=body % MODEL,
                                   headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert field in (error["param"] or "") and "Unicode" in error["message"]
    assert generator.requests == []

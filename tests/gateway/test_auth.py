import httpx
import pytest

from gateway.auth import ApiKeys
from gateway.sessions.generation import GeneratedChunk
from gateway.http_app import create_app
from gateway.settings import HttpSettings
from tokenizers_fixture import build_tokenizer


@pytest.mark.parametrize("header,allowed", [
    ("Bearer k1", True), ("bearer k2", True), ("Bearer nope", False), ("k1", False), (None, False),
])
def test_bearer_keys(header, allowed):
    assert ApiKeys(("k1", "k2")).allows(header) is allowed
    assert ApiKeys(()).allows(header) is True  # no keys configured: open


class OneChunk:
    async def generate(self, request):
        yield GeneratedChunk("s", [5], None)


async def test_http_routes_need_a_key_except_public_ones():
    settings = HttpSettings(model_name="m", context_length=128, api_keys=("secret",))
    app = create_app(settings, build_tokenizer(), OneChunk())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        denied = await http.get("/v1/models")
        assert denied.status_code == 401
        assert denied.json()["error"]["code"] == "invalid_api_key"
        allowed = await http.get("/v1/models", headers={"Authorization": "Bearer secret"})
        assert allowed.status_code == 200
        for path in ("/health", "/ready", "/metrics"):
            assert (await http.get(path)).status_code == 200

"""With the session store unreachable, new requests get 503 + Retry-After on HTTP and
UNAVAILABLE on gRPC (after the client's retries), never a 500; the gateway stays ready (in its
Service), so clients get that answer rather than a refused connection."""

import grpc
import httpx
import pytest

from cascade.tools.redis_server import free_port
from cascade.tools.tiny_models import build_tiny_pair
from cascade.v1 import gateway_pb2, gateway_pb2_grpc
from gateway.server import build_gateway
from cascade.serving.mesh.security import MeshSettings
from gateway.settings import GatewaySettings
from gateway.sessions.session_store import connect


@pytest.fixture
async def gateway_without_redis(tmp_path):
    target, _ = build_tiny_pair(tmp_path / "models")
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    client = connect(url, timeout_s=0.2, retries=1)
    settings = GatewaySettings(model=str(target), mesh=MeshSettings(redis_url=url), grpc_port=0)
    app, grpc_service = build_gateway(settings, client)
    await grpc_service.start()
    yield app, grpc_service
    await grpc_service.drain()
    await client.aclose()


async def test_requests_while_redis_is_down_get_503_and_unavailable(gateway_without_redis):
    app, grpc_service = gateway_without_redis
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
        for stream in (False, True):
            response = await http.post("/v1/completions", json={
                "model": "target", "prompt": "def main():", "max_tokens": 4, "stream": stream})
            assert response.status_code == 503, response.text
            assert response.headers["retry-after"] == "1"
            assert response.json()["error"]["code"] == "store_unavailable"
        assert (await http.get("/ready")).status_code == 200  # stays in the Service: 503s
    async with grpc.aio.insecure_channel(grpc_service.address) as channel:
        request = gateway_pb2.GenerateRequest(prompt="def main():")
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            [r async for r in gateway_pb2_grpc.GatewayStub(channel).Generate(request)]
    assert failure.value.code() == grpc.StatusCode.UNAVAILABLE

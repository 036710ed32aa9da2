"""Every way a generation ends leaves a final status in Redis and the right finish_reason in
the metrics: finished (length), stopped by a stop string (finished, reason stop), abandoned by
the client (cancelled, reason abort)."""

import asyncio

import httpx

from cascade.serving import metrics
from cluster_expectations import clear_sessions

PROMPT = "def main():"


def finished(reason: str) -> float:
    return metrics.REQUESTS_FINISHED.labels(finished_reason=reason)._value.get()


async def statuses(cluster) -> list[str]:
    keys = [k async for k in cluster.client.scan_iter(match="cascade:session:*")
            if not k.endswith((b":tokens", b":rounds"))]
    return [(await cluster.client.hget(k, "status")).decode() for k in keys]


async def settled(cluster, expected: list[str]) -> list[str]:
    for _ in range(200):
        found = await statuses(cluster)
        if found == expected:
            break
        await asyncio.sleep(0.02)
    return found


async def test_length_stop_string_and_disconnect_each_end_with_their_status(cluster):
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 24, "temperature": 0}
    async with httpx.AsyncClient(base_url=cluster.http_url, timeout=60) as http:
        await clear_sessions(cluster)
        before = finished("length")
        full = (await http.post("/v1/completions", json=body)).json()["choices"][0]
        assert full["finish_reason"] == "length"
        assert await settled(cluster, ["finished"]) == ["finished"]
        assert finished("length") == before + 1

        await clear_sessions(cluster)
        stop = full["text"][len(full["text"]) // 3 :][:3]  # a string the output contains early
        before = finished("stop")
        cut = (await http.post("/v1/completions", json={**body, "stop": [stop]})).json()
        assert cut["choices"][0]["finish_reason"] == "stop"
        assert await settled(cluster, ["finished"]) == ["finished"]
        assert finished("stop") == before + 1

        await clear_sessions(cluster)
        before = finished("abort")
        long = {**body, "max_tokens": 200, "stream": True}
        async with http.stream("POST", "/v1/completions", json=long) as response:
            async for _ in response.aiter_lines():
                break  # the client goes away after the first event
        assert await settled(cluster, ["cancelled"]) == ["cancelled"]
        assert finished("abort") == before + 1

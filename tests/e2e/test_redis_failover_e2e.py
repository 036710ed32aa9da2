"""A local cluster on Redis with a replica and sentinels (`cascade up --redis-replicas 1`):
killing the Redis primary (kill -9) mid-stream costs a pause, not the stream: the sentinels
promote the replica, every service's client follows it, and the text is the no-fault run's."""

import json

import httpx

from cascade.tools.local_cluster import LocalCluster

from cascade.tools.cluster_config import ClusterConfig

BODY = {"model": "target", "prompt": "import os", "max_tokens": 120, "temperature": 0,
        "num_draft_tokens": 0}


def _streamed_text(url: str, on_chunk) -> str:
    text = []
    with httpx.stream("POST", f"{url}/v1/completions", json={**BODY, "stream": True},
                      timeout=120) as response:
        assert response.status_code == 200
        for number, line in enumerate(response.iter_lines()):
            if line.startswith("data: {"):
                text.append(json.loads(line[6:])["choices"][0]["text"])
                on_chunk(number)
    return "".join(text)


def test_a_stream_survives_killing_the_redis_primary(tiny_pair_dirs, tmp_path):
    target, drafter = tiny_pair_dirs
    config = ClusterConfig(target, drafter, http_port=0, grpc_port=0,
                           workdir=tmp_path, redis_replicas=1)
    cluster = LocalCluster(config).start()
    try:
        expected = httpx.post(f"{cluster.http_url}/v1/completions", json=BODY,
                              timeout=120).json()["choices"][0]["text"]
        old = cluster.redis.primary_port()

        def kill_primary(number: int) -> None:
            if number == 10:
                cluster.redis.server_on(old).process.kill()

        assert _streamed_text(cluster.http_url, kill_primary) == expected
        assert cluster.redis.wait_for_failover(old) != old
        assert _streamed_text(cluster.http_url, lambda number: None) == expected
    finally:
        cluster.stop()

"""A client resumes its stream on another gateway after its own died (kill -9), with real
processes: the concatenated text equals the uninterrupted generation, and the session ends
finished under the new gateway's epoch."""

import json
import os
import signal
import time
from contextlib import contextmanager

import httpx
import redis

from cascade.tools.local_cluster import LocalCluster

from cascade.tools.cluster_config import ClusterConfig
from gateway.sessions.session_store import session_keys

SHORT_LEASE = ("--session-lease-s", "2")
BODY = {"model": "target", "prompt": "import os\nimport sys\n", "max_tokens": 200,
        "temperature": 0, "num_draft_tokens": 3}


@contextmanager
def two_gateways(pair_dirs, workdir, *gateway_args: str):
    """A local cluster (tiny pair) with a second gateway: (cluster, its HTTP URL, its gRPC
    address); both gateways get ``gateway_args``."""
    config = ClusterConfig(*pair_dirs, http_port=0, grpc_port=0,
                           workdir=workdir, gateway_args=gateway_args)
    cluster = LocalCluster(config).start()
    try:
        yield cluster, *cluster.add_gateway()
    finally:
        cluster.stop()


def read_events(lines, stop_after: int | None = None) -> tuple[str, str | None, bool]:
    """(text, last event id, saw [DONE]) of an SSE response's lines, reading at most
    ``stop_after`` events that carry an id."""
    text, last_id, seen = "", None, 0
    for line in lines:
        if line.startswith("id: "):
            last_id = line[4:]
            seen += 1
        elif line == "data: [DONE]":
            return text, last_id, True
        elif line.startswith("data: "):
            choices = json.loads(line[6:]).get("choices") or [{}]
            text += choices[0].get("text") or ""
        if stop_after is not None and seen >= stop_after and line == "":
            return text, last_id, False
    return text, last_id, False


def test_a_stream_resumes_on_another_gateway_after_its_gateway_died(tiny_pair_dirs, tmp_path):
    with two_gateways(tiny_pair_dirs, tmp_path, *SHORT_LEASE) as (cluster, other, _):
        whole = httpx.post(f"{cluster.http_url}/v1/completions", json=BODY, timeout=120)
        expected = whole.json()["choices"][0]["text"]
        with httpx.stream("POST", f"{cluster.http_url}/v1/completions", timeout=120,
                          json={**BODY, "stream": True}) as response:
            before, last_id, done = read_events(response.iter_lines(), stop_after=2)
            gateway = cluster.processes["gateway"]
            os.kill(gateway.pid, signal.SIGSTOP)  # frozen mid-stream, then dead
            os.kill(gateway.pid, signal.SIGKILL)
        assert not done and last_id
        started = time.monotonic()
        with httpx.stream("GET", f"{other}/v1/sessions/{last_id.split('.')[0]}/events",
                          headers={"Last-Event-ID": last_id}, timeout=120) as response:
            assert response.status_code == 200
            after, _, done = read_events(response.iter_lines())
        assert done and before + after == expected
        assert time.monotonic() - started < 15  # the lease (2 s) lapsed, then it continued
        record = redis.Redis.from_url(cluster.redis.url).hgetall(
            session_keys(last_id.split(".")[0])[0])
        assert record[b"status"] == b"finished" and int(record[b"epoch"]) >= 2


def test_the_grpc_client_resumes_on_its_own(tiny_pair_dirs, tmp_path):
    """stream_generation, given two gateways, finishes the generation on the second when the
    first is killed mid-stream: the same text and tokens as an uninterrupted run."""
    from cascade.tools.client import stream_generation

    with two_gateways(tiny_pair_dirs, tmp_path, *SHORT_LEASE) as (cluster, _, other):
        gateways = [cluster.grpc_address, other]
        args = dict(prompt="import os\nimport sys\n", max_tokens=200, num_draft_tokens=3,
                    chat=False)
        expected = stream_generation(gateways, **args)
        seen = []

        def kill_first_gateway(response) -> None:
            seen.append(response.round)
            if len(seen) == 2:
                gateway = cluster.processes["gateway"]
                os.kill(gateway.pid, signal.SIGSTOP)
                os.kill(gateway.pid, signal.SIGKILL)

        resumed = stream_generation(gateways, on_response=kill_first_gateway, **args)
        assert resumed.token_ids == expected.token_ids and resumed.text == expected.text
        assert seen == list(range(1, len(seen) + 1))  # no round twice, none skipped


def test_a_draining_gateway_hands_its_unfinished_streams_over(tiny_pair_dirs, tmp_path):
    """SIGTERM with a short grace period: the stream still running when it ends is cancelled,
    and its client resumes it on the other gateway at once (the lease, 60 s, is not waited
    out), with the same text as an uninterrupted run."""
    with two_gateways(tiny_pair_dirs, tmp_path, "--session-lease-s", "60",
                      "--grace-s", "0.2") as (cluster, other, _):
        body = {**BODY, "max_tokens": 900}
        expected = httpx.post(f"{other}/v1/completions", json=body,
                              timeout=120).json()["choices"][0]["text"]
        with httpx.stream("POST", f"{cluster.http_url}/v1/completions", timeout=120,
                          json={**body, "stream": True}) as response:
            lines = response.iter_lines()
            before, last_id, _ = read_events(lines, stop_after=2)
            cluster.processes["gateway"].send_signal(signal.SIGTERM)
            try:
                rest, cut_id, done = read_events(lines)  # what arrives until the cut
            except httpx.HTTPError:  # the connection was closed mid-chunk
                rest, cut_id, done = "", None, False
            before, last_id = before + rest, cut_id or last_id
        assert cluster.processes["gateway"].wait(30) == 0
        assert not done, "the stream finished within the grace period: nothing to hand over"
        started = time.monotonic()
        with httpx.stream("GET", f"{other}/v1/sessions/{last_id.split('.')[0]}/events",
                          headers={"Last-Event-ID": last_id}, timeout=120) as response:
            after, _, done = read_events(response.iter_lines())
        assert done and before + after == expected
        assert time.monotonic() - started < 30  # taken over at once, not after the lease

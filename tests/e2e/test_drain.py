"""A real SIGTERM mid-stream: to a gateway, the HTTP and gRPC streams in flight finish whole,
new connections are refused and the process exits 0; to a verifier whose grace period is too
short, its session moves to the other verifier and the stream completes unchanged."""

from __future__ import annotations

import json
import signal
import threading

import grpc
import httpx

from cascade.tools.local_cluster import LocalCluster

from cascade.tools.cluster_config import ClusterConfig
from cascade.v1 import gateway_pb2, gateway_pb2_grpc

MAX_TOKENS = 400


def http_stream(url: str, started: threading.Event, result: dict) -> None:
    body = {"model": "target", "prompt": "import os", "max_tokens": MAX_TOKENS,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    events = []
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                started.set()
    result["events"] = events


def grpc_stream(address: str, started: threading.Event, result: dict) -> None:
    with grpc.insecure_channel(address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        request = gateway_pb2.GenerateRequest(prompt="def main():", temperature=0,
                                              max_tokens=MAX_TOKENS, num_draft_tokens=3)
        responses = []
        for response in stub.Generate(request, timeout=120):
            responses.append(response)
            started.set()
        result["responses"] = responses


def test_sigterm_drains_streams_in_flight_and_exits_zero(tiny_pair_dirs, tmp_path):
    target, drafter = tiny_pair_dirs
    config = ClusterConfig(target, drafter, http_port=0, grpc_port=0,
                           workdir=tmp_path)
    cluster = LocalCluster(config).start()
    try:
        http_started, grpc_started = threading.Event(), threading.Event()
        http_result, grpc_result = {}, {}
        threads = [threading.Thread(target=http_stream, args=(cluster.http_url, http_started,
                                                              http_result)),
                   threading.Thread(target=grpc_stream, args=(cluster.grpc_address,
                                                              grpc_started, grpc_result))]
        for thread in threads:
            thread.start()
        # Both streams in flight before the signal: a call still connecting is refused.
        assert http_started.wait(60), "the HTTP stream did not start"
        assert grpc_started.wait(60), "the gRPC stream did not start"
        gateway = cluster.processes["gateway"]
        gateway.send_signal(signal.SIGTERM)
        for thread in threads:
            thread.join(120)
        assert gateway.wait(60) == 0
        events = http_result["events"]
        assert events[-1] == "[DONE]"
        usage = json.loads(events[-2])["usage"]
        assert usage["completion_tokens"] == MAX_TOKENS
        responses = grpc_result["responses"]
        assert responses[-1].finish_reason != 0
        assert sum(len(r.token_ids) for r in responses) == MAX_TOKENS
        try:  # nobody listens any more
            httpx.get(f"{cluster.http_url}/health", timeout=2)
            raise AssertionError("the drained gateway still accepts connections")
        except httpx.ConnectError:
            pass
    finally:
        cluster.stop()


def test_a_draining_verifier_hands_its_sessions_to_another(tiny_pair_dirs, tmp_path):
    """SIGTERM to the verifier serving a long stream, with a grace period too short for it:
    the session moves to the other verifier and the client's stream completes unchanged."""
    import redis

    from gateway.sessions.session_store import session_keys

    target, drafter = tiny_pair_dirs
    config = ClusterConfig(target, drafter, http_port=0, grpc_port=0,
                           workdir=tmp_path, num_verifiers=2, verifier_args=("--grace-s", "0.2"))
    cluster = LocalCluster(config).start()
    try:
        with grpc.insecure_channel(cluster.grpc_address) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            request = gateway_pb2.GenerateRequest(prompt="def main():", temperature=0,
                                                  max_tokens=MAX_TOKENS, num_draft_tokens=3,
                                                  chat=False)
            expected = [t for r in stub.Generate(request, timeout=120) for t in r.token_ids]
            tokens, victim, store = [], None, redis.Redis.from_url(cluster.redis.url)
            for response in stub.Generate(request, timeout=120):
                tokens += response.token_ids
                if victim is None:
                    record = session_keys(response.session_id)[0]
                    address = store.hget(record, "verifier").decode()
                    victim = cluster.processes[cluster.name_of(address)]
                    victim.send_signal(signal.SIGTERM)
        assert victim.wait(30) == 0
        assert tokens == expected
        assert int(store.hget(record, "epoch")) >= 2  # it moved: the verifier did not finish it
        assert store.hget(record, "verifier").decode() != address
    finally:
        cluster.stop()

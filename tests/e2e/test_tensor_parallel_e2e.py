"""Verifiers that split the target over two ranks (``--tensor-parallel 2``: gloo, processes of
their own) behind the gateway: greedy output through the services equals the whole target's
greedy decoding, with chains and trees; a rank killed mid-stream takes its verifier down
(exit status 70) and the session completes on the other verifier, unchanged."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import grpc
import redis

from cascade.core.parallel.rank_processes import RANK_LOST_EXIT
from cascade.tools.local_cluster import LocalCluster
from cascade.tools.cluster_config import ClusterConfig
from cascade.v1 import gateway_pb2, gateway_pb2_grpc
from gateway.sessions.session_store import session_keys
from models import hf_greedy

MAX_TOKENS = 200


def children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(child) for child in text.split()]


def is_zombie(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


def test_split_verifiers_serve_exactly_and_a_lost_rank_moves_the_session(
        tiny_pair_dirs, tiny_runners, tmp_path):
    target_dir, drafter_dir = tiny_pair_dirs
    whole, _ = tiny_runners
    config = ClusterConfig(target_dir, drafter_dir, http_port=0, grpc_port=0, workdir=tmp_path,
                           num_verifiers=2,
                           verifier_args=("--tensor-parallel", "2", "--grace-s", "0.2"))
    cluster = LocalCluster(config).start()
    try:
        for name in ("verifier", "verifier-1"):
            log = (tmp_path / f"{name}.log").read_text()
            assert "tensor parallel: all 2 ranks loaded their slices" in log
        prompt = "def main():"
        expected = hf_greedy(whole, whole.tokenizer(prompt).input_ids, MAX_TOKENS)
        eos = whole.tokenizer.eos_token_id
        expected = expected[: expected.index(eos) + 1] if eos in expected else expected
        with grpc.insecure_channel(cluster.grpc_address) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)

            def request(**fields) -> gateway_pb2.GenerateRequest:
                return gateway_pb2.GenerateRequest(prompt=prompt, temperature=0, chat=False,
                                                   max_tokens=MAX_TOKENS, **fields)

            for fields in ({"num_draft_tokens": 3}, {"num_draft_tokens": 3,
                                                    "draft_tree_nodes": 8}):
                tokens = [t for r in stub.Generate(request(**fields), timeout=120)
                          for t in r.token_ids]
                assert tokens == expected
            tokens, victim, store = [], None, redis.Redis.from_url(cluster.redis.url)
            for response in stub.Generate(request(num_draft_tokens=3), timeout=120):
                tokens += response.token_ids
                if victim is None:
                    record = session_keys(response.session_id)[0]
                    address = store.hget(record, "verifier").decode()
                    victim = cluster.processes[cluster.name_of(address)]
                    (follower,) = children(victim.pid)
                    os.kill(follower, signal.SIGKILL)
        assert victim.wait(30) == RANK_LOST_EXIT
        assert tokens == expected
        assert store.hget(record, "verifier").decode() != address  # it moved
        log = (tmp_path / f"{cluster.name_of(address)}.log").read_text()
        assert f"rank process {follower} exited" in log
        survivor = next(p for n, p in cluster.processes.items()
                        if n.startswith("verifier") and p is not victim)
        (other_follower,) = children(survivor.pid)
    finally:
        cluster.stop()
    assert survivor.returncode == 0  # drained, then stopped its follower
    assert not Path(f"/proc/{other_follower}").exists() or is_zombie(other_follower)

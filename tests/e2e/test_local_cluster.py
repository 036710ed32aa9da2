"""`cascade up` machinery: real processes, real Redis; start, generate, stop, nothing left."""

import os
import socket

import httpx

from cascade.cli.main import served_model
from cascade.tools import local_cluster
from cascade.tools.local_cluster import ClusterConfig, LocalCluster


def is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie has exited; only its table entry remains until reaped
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_local_cluster_starts_serves_and_stops_cleanly(tiny_pair_dirs, tmp_path, monkeypatch):
    """Also: a picked port taken before its process binds it (here a drafter's and the
    gateway's HTTP port) only makes the launcher start that process again on new ones."""
    target, drafter = tiny_pair_dirs
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        picks = iter([None, taken.getsockname()[1], None, taken.getsockname()[1]])
        free_port = local_cluster.free_port
        monkeypatch.setattr(local_cluster, "free_port",
                            lambda: next(picks, None) or free_port())
        config = ClusterConfig(target, drafter, num_drafters=2, http_port=0, grpc_port=0,
                               workdir=tmp_path)
        cluster = LocalCluster(config).start()
    for name in ("drafter-0", "gateway"):
        assert "starting it again on new ports" in (tmp_path / f"{name}.log").read_text()
    pids = [p.pid for p in cluster.processes.values()] + [cluster.redis.process.pid]
    try:
        assert sorted(cluster.processes) == ["drafter-0", "drafter-1", "gateway", "verifier"]
        assert served_model(cluster.http_url) == target.name  # what `cascade up` prints
        body = {"model": target.name, "prompt": "import os", "max_tokens": 8, "temperature": 0}
        response = httpx.post(f"{cluster.http_url}/v1/completions", json=body, timeout=60)
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] >= 1
        assert_closed_to_strangers(cluster)
    finally:
        cluster.stop()
    assert all(p.returncode is not None for p in cluster.processes.values())
    assert not [pid for pid in pids if is_running(pid)]


def assert_closed_to_strangers(cluster: LocalCluster) -> None:
    """Redis wants the cluster's password; the pods' ports speak only mutual TLS."""
    import grpc
    import pytest
    import redis
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=cluster.redis.port).ping()
    assert redis.Redis.from_url(cluster.redis.url).ping()
    for name in ("verifier", "drafter-0"):
        with grpc.insecure_channel(cluster.address_of(name)) as channel:
            with pytest.raises(grpc.RpcError) as caught:
                health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                          timeout=5)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    for process in cluster.processes.values():
        assert cluster.redis.password not in " ".join(process.args)


def test_demo_runs_both_generations_and_compares_them(tiny_pair_dirs, tmp_path):
    import subprocess
    import sys

    target, drafter = tiny_pair_dirs
    command = [sys.executable, "-c", "from cascade.cli.main import app; app()", "demo", "hello",
               "--target", str(target), "--drafter", str(drafter), "--max-tokens", "8",
               "--port", "0", "--grpc-port", "0"]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "identical output: True" in result.stdout
    assert "per-round overhead" in result.stdout


def test_process_counts_are_bounded(tiny_pair_dirs):
    import pytest

    target, drafter = tiny_pair_dirs
    for bad in ({"num_drafters": 0}, {"num_verifiers": 8000}):
        with pytest.raises(ValueError, match="must be in"):
            ClusterConfig(target, drafter, **bad)

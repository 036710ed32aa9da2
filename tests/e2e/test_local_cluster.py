"""`cascade up` machinery: real processes, real Redis; start, generate, stop, nothing left."""

import os
import socket

import httpx

from prometheus_client.parser import text_string_to_metric_families

from cascade.cli.main import served_card
from cascade.tools import local_cluster
from cascade.tools.client import stream_generation
from cascade.tools.local_cluster import LocalCluster
from cascade.tools.cluster_config import ClusterConfig


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
    """Also: a picked port taken before its process binds it (here the verifier's metrics
    port, a drafter's and the gateway's HTTP port) only makes the launcher start that process
    again on new ones."""
    target, drafter = tiny_pair_dirs
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]  # picked: verifier, its metrics, drafter-0, its metrics,
        picks = iter([None, port, port, None, None, None, port])  # drafter-1, its, gateway
        free_port = local_cluster.free_port
        monkeypatch.setattr(local_cluster, "free_port",
                            lambda: next(picks, None) or free_port())
        config = ClusterConfig(target, drafter, num_drafters=2, http_port=0, grpc_port=0,
                               workdir=tmp_path)
        cluster = LocalCluster(config).start()
    for name in ("verifier", "drafter-0", "gateway"):
        assert "starting it again on new ports" in (tmp_path / f"{name}.log").read_text()
    pids = [p.pid for p in cluster.processes.values()] + [cluster.redis.process.pid]
    try:
        assert sorted(cluster.processes) == ["drafter-0", "drafter-1", "gateway", "verifier"]
        card = served_card(cluster.http_url)  # what `cascade up` prints
        assert (card["id"], card["dtype"]) == (target.name, "float32")
        body = {"model": target.name, "prompt": "import os", "max_tokens": 8, "temperature": 0}
        response = httpx.post(f"{cluster.http_url}/v1/completions", json=body, timeout=60)
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] >= 1
        assert_closed_to_strangers(cluster)
        assert_metrics_count_what_clients_got(cluster, target.name)
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


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    text = httpx.get(url, timeout=10).text
    assert "_created" not in text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def assert_metrics_count_what_clients_got(cluster: LocalCluster, model: str) -> None:
    """Each process serves its own series, labelled with the model; the gateway's acceptance
    counters add up the rounds its clients received."""
    urls = cluster.metrics_urls()
    assert sorted(urls) == ["drafter-0", "drafter-1", "gateway", "verifier"]
    label = (("model_name", model),)
    own = {"verifier": "cascade:verifier_queue_depth", "drafter-0": "cascade:draft_seconds_count",
           "gateway": "cascade:spec_decode_num_drafts_total"}
    for name, series in own.items():
        samples = scrape(urls[name])
        assert (series, label) in samples, name
        assert not [key for key in samples if key[0] in own.values() and key[0] != series]
    before = scrape(urls["gateway"])
    runs = [stream_generation(cluster.grpc_address, prompt, 12, 3, chat=False,
                              schedule="fixed", draft_method="model")
            for prompt in ("import os", "def main():")]
    after = scrape(urls["gateway"])

    def delta(name: str) -> float:
        return after[(f"cascade:spec_decode_{name}_total", label)] - before.get(
            (f"cascade:spec_decode_{name}_total", label), 0.0)

    assert delta("num_draft_tokens") == sum(r.stats.num_draft_tokens for r in runs) > 0
    assert delta("num_accepted_tokens") == sum(r.stats.num_accepted_tokens for r in runs)
    assert delta("num_drafts") == sum(r.stats.num_drafts for r in runs)


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


def cluster_processes(workdir) -> list[int]:
    """Pids of live processes started for the cluster in ``workdir`` (they name its files or
    run in it, as Redis does)."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as file:
                command = file.read().replace(b"\0", b" ").decode(errors="replace")
            command += " " + os.readlink(f"/proc/{entry}/cwd")
        except (FileNotFoundError, PermissionError, NotADirectoryError, ProcessLookupError):
            continue
        if str(workdir) in command and "cascade.cli" not in command and is_running(int(entry)):
            pids.append(int(entry))
    return pids


def test_cascade_up_stops_everything_on_sigterm(tiny_pair_dirs, tmp_path):
    """A supervisor's SIGTERM (systemd, docker stop, timeout) stops the whole cluster, and the
    logs land in --workdir, the previous run's kept aside."""
    import signal
    import subprocess
    import sys
    import time

    target, drafter = tiny_pair_dirs
    (tmp_path / "gateway.log").write_text("an earlier run\n")
    command = [sys.executable, "-c", "from cascade.cli.main import app; app()", "up",
               "--target", str(target), "--drafter", str(drafter), "--port", "0",
               "--grpc-port", "0", "--workdir", str(tmp_path), "--dtype", "float32"]
    up = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True)
    try:
        lines = []
        for line in up.stdout:  # until it prints that it is ready
            lines.append(line)
            if "Ctrl-C stops the cluster" in line:
                break
        output = " ".join("".join(lines).split())  # as printed, unwrapped
        assert "metrics: verifier http://" in output and "gateway http://" in output, output
        assert f"model {target.name} in float32" in output, output  # what the verifier serves
        started = cluster_processes(tmp_path)
        assert len(started) >= 4  # redis, verifier, drafter, gateway
        up.send_signal(signal.SIGTERM)
        assert up.wait(timeout=60) == 0
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while cluster_processes(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert cluster_processes(tmp_path) == []
    assert (tmp_path / "gateway.log.1").read_text() == "an earlier run\n"
    assert "an earlier run" not in (tmp_path / "gateway.log").read_text()

"""The start scripts of the replicated Redis (k8s/components/redis-ha), run for real on loopback
with the redis-server and redis-cli this machine has: a fresh install makes the initial
primary primary and the others its replicas; after a failover, a data node that starts again
follows the promoted primary instead of claiming its old role, and a sentinel that starts again
monitors the promoted primary too; a replica is not promotable until it has synced."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import redis

from cascade.tools.redis_server import free_port, redis_server_binary

SCRIPTS = Path(__file__).resolve().parents[2] / "k8s" / "components" / "redis-ha"
PASSWORD = "ha-test"
SERVICE = "cascade"

pytestmark = pytest.mark.skipif(
    shutil.which("redis-cli", path=str(Path(redis_server_binary()).parent)) is None
    or shutil.which("timeout") is None, reason="needs redis-cli beside redis-server, and timeout")


class Cluster:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.nodes = [free_port() for _ in range(2)]
        self.sentinels = [free_port() for _ in range(3)]
        self.processes: dict[str, subprocess.Popen] = {}

    def env(self, **extra: str) -> dict[str, str]:
        bin_dir = str(Path(redis_server_binary()).parent)
        return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "REDIS_PASSWORD": PASSWORD,
                "REDIS_INITIAL_PRIMARY": "127.0.0.1",
                "REDIS_INITIAL_PRIMARY_PORT": str(self.nodes[0]),
                "SENTINELS": " ".join(f"127.0.0.1:{p}" for p in self.sentinels),
                "SERVICE": SERVICE, **extra}

    def start_node(self, i: int) -> str:
        """Start data node ``i`` with its script; returns the script's first line."""
        data = self.folder / f"node-{i}"
        data.mkdir(exist_ok=True)
        env = self.env(REDIS_ANNOUNCE_HOST="127.0.0.1", REDIS_PORT=str(self.nodes[i]))
        command = ["redis-server", "--port", str(self.nodes[i]), "--bind", "127.0.0.1",
                   "--dir", str(data), "--appendonly", "yes", "--requirepass", PASSWORD]
        return self._start(f"node-{i}", "redis-node.sh", env, self.nodes[i], command)

    def start_sentinel(self, i: int) -> str:
        folder = self.folder / f"sentinel-{i}"
        folder.mkdir(exist_ok=True)
        env = self.env(SENTINEL_ANNOUNCE_HOST="127.0.0.1", SENTINEL_BIND="127.0.0.1",
                       SENTINEL_PORT=str(self.sentinels[i]),
                       REDIS_PORT=str(self.nodes[0]), SENTINEL_QUORUM="2",
                       SENTINEL_DIR=str(folder), SENTINEL_DOWN_AFTER_MS="1000",
                       SENTINEL_FAILOVER_TIMEOUT_MS="5000")
        return self._start(f"sentinel-{i}", "sentinel.sh", env, self.sentinels[i])

    def _start(self, name: str, script: str, env: dict, port: int,
               command: list[str] = ()) -> str:
        log_path = self.folder / f"{name}.log"
        with log_path.open("w") as log:
            self.processes[name] = subprocess.Popen(["sh", str(SCRIPTS / script), *command],
                                                    env=env,
                                                    stdout=log, stderr=subprocess.STDOUT)
        client = redis.Redis(port=port, password=PASSWORD, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                client.ping()
                return log_path.read_text().splitlines()[0]
            except redis.RedisError:
                time.sleep(0.1)
        raise AssertionError(f"{name} did not start: {log_path.read_text()}")

    def node(self, i: int) -> redis.Redis:
        return redis.Redis(port=self.nodes[i], password=PASSWORD)

    def primary(self) -> int:
        sentinel = redis.Redis(port=self.sentinels[0], password=PASSWORD)
        return int(sentinel.sentinel_get_master_addr_by_name(SERVICE)[1])

    def stop(self) -> None:
        for process in self.processes.values():
            process.kill()
            process.wait()


def _wait(condition, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except redis.RedisError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _role(client: redis.Redis) -> tuple[str, int | None]:
    info = client.info("replication")
    return info["role"], info.get("master_port")


def test_failover_and_restarts_follow_the_promoted_primary(tmp_path):
    cluster = Cluster(tmp_path)
    try:
        # A fresh install: no sentinel answers yet, so node 0 is the primary.
        assert cluster.start_node(0) == "starting as the primary"
        assert cluster.start_node(1) == f"starting as a replica of 127.0.0.1:{cluster.nodes[0]}"
        for i in range(3):
            assert cluster.start_sentinel(i) == f"monitoring 127.0.0.1:{cluster.nodes[0]}"
        _wait(lambda: _role(cluster.node(1)) == ("slave", cluster.nodes[0]), "replication")
        cluster.node(0).set("session", "tokens")
        assert cluster.node(0).wait(1, 5000) == 1

        cluster.processes["node-0"].kill()  # the primary dies; the sentinels promote node 1
        cluster.processes["node-0"].wait()
        _wait(lambda: cluster.primary() == cluster.nodes[1], "the failover")

        # Node 0 comes back: the sentinels name node 1, so it follows node 1; it is not
        # promotable until it has synced (node 1 hangs meanwhile, so it cannot sync yet).
        cluster.processes["node-1"].send_signal(signal.SIGSTOP)
        try:
            assert cluster.start_node(0) == (f"starting as a replica of 127.0.0.1:"
                                             f"{cluster.nodes[1]}")
            assert cluster.node(0).config_get("replica-priority")["replica-priority"] == "0"
        finally:
            cluster.processes["node-1"].send_signal(signal.SIGCONT)
        _wait(lambda: _role(cluster.node(0)) == ("slave", cluster.nodes[1]), "node 0 to follow")
        _wait(lambda: cluster.node(0).config_get("replica-priority")["replica-priority"] == "100",
              "node 0 to be promotable once synced")
        assert cluster.node(1).get("session") == b"tokens"
        _wait(lambda: cluster.node(0).get("session") == b"tokens", "node 0 to sync")

        # A sentinel that restarts asks its peers: it monitors node 1, not the install's primary.
        cluster.processes["sentinel-0"].kill()
        cluster.processes["sentinel-0"].wait()
        assert cluster.start_sentinel(0) == f"monitoring 127.0.0.1:{cluster.nodes[1]}"
        assert cluster.primary() == cluster.nodes[1]
    finally:
        cluster.stop()

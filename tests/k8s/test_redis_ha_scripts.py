"""The start scripts of the replicated Redis (k8s/components/redis-ha), run for real on loopback
with the redis-server and redis-cli this machine has: a fresh install makes the initial
primary primary and the others its replicas; after a failover, a data node that starts again
follows the promoted primary instead of claiming its old role, and a sentinel that starts again
monitors the promoted primary too; a replica is not promotable until it has synced. With no
sentinel to ask (all of them restarted together, which keeps no state), both scripts ask the data
nodes which one is the primary, and use the install-time primary only when none answers."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import redis

from cascade.tools.redis_server import RedisServer, free_port, redis_server_binary

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
                "REDIS_NODES": " ".join(f"127.0.0.1:{p}" for p in self.nodes),
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
        return self.start_sentinels(i)[0]

    def start_sentinels(self, *indices: int) -> list[str]:
        """Start these sentinels at once, each with an empty folder (a sentinel keeps no
        state); returns each script's first line."""
        for i in indices:
            folder = self.folder / f"sentinel-{i}"
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            env = self.env(SENTINEL_ANNOUNCE_HOST="127.0.0.1", SENTINEL_BIND="127.0.0.1",
                           SENTINEL_PORT=str(self.sentinels[i]),
                           REDIS_PORT=str(self.nodes[0]), SENTINEL_QUORUM="2",
                           SENTINEL_DIR=str(folder), SENTINEL_DOWN_AFTER_MS="1000",
                           SENTINEL_FAILOVER_TIMEOUT_MS="5000")
            self._spawn(f"sentinel-{i}", "sentinel.sh", env)
        return [self._started(f"sentinel-{i}", self.sentinels[i]) for i in indices]

    def kill(self, name: str) -> None:
        self.processes[name].kill()
        self.processes[name].wait()

    def _start(self, name: str, script: str, env: dict, port: int,
               command: list[str] = ()) -> str:
        self._spawn(name, script, env, command)
        return self._started(name, port)

    def _spawn(self, name: str, script: str, env: dict, command: list[str] = ()) -> None:
        with (self.folder / f"{name}.log").open("w") as log:
            self.processes[name] = subprocess.Popen(["sh", str(SCRIPTS / script), *command],
                                                    env=env,
                                                    stdout=log, stderr=subprocess.STDOUT)

    def _started(self, name: str, port: int) -> str:
        """Wait until the server ``name`` answers; returns its script's first line."""
        log_path = self.folder / f"{name}.log"
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


def _install_and_fail_over(cluster: Cluster) -> None:
    """A fresh install (no sentinel answers yet, so node 0 is the primary), a write node 1 has,
    then node 0 dies and the sentinels promote node 1."""
    assert cluster.start_node(0) == "starting as the primary"
    assert cluster.start_node(1) == f"starting as a replica of 127.0.0.1:{cluster.nodes[0]}"
    assert cluster.start_sentinels(0, 1, 2) == [f"monitoring 127.0.0.1:{cluster.nodes[0]}"] * 3
    _wait(lambda: _role(cluster.node(1)) == ("slave", cluster.nodes[0]), "replication")
    _wait(lambda: cluster.node(1).config_get("replica-priority")["replica-priority"] == "100",
          "node 1 to be promotable once synced")
    cluster.node(0).set("session", "tokens")
    assert cluster.node(0).wait(1, 5000) == 1
    cluster.kill("node-0")
    _wait(lambda: cluster.primary() == cluster.nodes[1], "the failover")


def test_failover_and_restarts_follow_the_promoted_primary(tmp_path):
    cluster = Cluster(tmp_path)
    try:
        _install_and_fail_over(cluster)

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
        cluster.kill("sentinel-0")
        assert cluster.start_sentinel(0) == f"monitoring 127.0.0.1:{cluster.nodes[1]}"
        assert cluster.primary() == cluster.nodes[1]
    finally:
        cluster.stop()


def test_with_every_sentinel_restarted_the_data_nodes_name_the_primary(tmp_path):
    """After a failover every sentinel restarts at once (a StatefulSet with Parallel pods, no
    volume): no peer knows a primary, so each asks the data nodes and monitors the promoted
    one, not the install-time one; the old primary, started again with or without sentinels
    to ask, follows the promoted primary."""
    cluster = Cluster(tmp_path)
    try:
        _install_and_fail_over(cluster)
        for i in range(3):
            cluster.kill(f"sentinel-{i}")
        promoted = f"127.0.0.1:{cluster.nodes[1]}"
        assert cluster.start_sentinels(0, 1, 2) == [f"monitoring {promoted}"] * 3
        assert cluster.start_node(0) == f"starting as a replica of {promoted}"
        _wait(lambda: _role(cluster.node(0)) == ("slave", cluster.nodes[1]), "node 0 to follow")
        _wait(lambda: cluster.node(0).get("session") == b"tokens", "node 0 to sync")
        assert cluster.primary() == cluster.nodes[1]

        # No sentinel at all: node 0, started again, asks node 1 itself.
        for name in ("sentinel-0", "sentinel-1", "sentinel-2", "node-0"):
            cluster.kill(name)
        assert cluster.start_node(0) == f"starting as a replica of {promoted}"
        _wait(lambda: _role(cluster.node(0)) == ("slave", cluster.nodes[1]), "node 0 to follow")
    finally:
        cluster.stop()


def _primary_from_data_nodes(cluster: Cluster, ports: list[int]) -> str:
    nodes = " ".join(f"127.0.0.1:{p}" for p in ports)
    result = subprocess.run(["sh", "-c", f'. "{SCRIPTS}/find-primary.sh" && '
                             "primary_from_data_nodes"],
                            env=cluster.env(REDIS_NODES=nodes, REDISCLI_AUTH=PASSWORD),
                            capture_output=True, text=True, timeout=30)
    return result.stdout.strip() if result.returncode == 0 else "none"


def test_the_data_nodes_name_the_primary_its_replicas_follow(tmp_path):
    """Of two nodes answering as a primary, the one with a replica (the other came back
    empty, a primary of nothing); with no primary up, the one the replicas follow; with no
    node up, none (a fresh install)."""
    cluster = Cluster(tmp_path)
    primary = RedisServer(tmp_path / "primary", password=PASSWORD).start()
    lone = RedisServer(tmp_path / "lone", password=PASSWORD).start()
    replica = RedisServer(tmp_path / "replica", password=PASSWORD, replica_of=primary.port,
                          announce_port=free_port()).start()
    down = free_port()
    try:
        _wait(lambda: replica.sync_client().info("replication")["master_link_status"] == "up",
              "replication")
        ports = [down, lone.port, replica.port, primary.port]
        assert _primary_from_data_nodes(cluster, ports) == f"127.0.0.1 {primary.port}"
        primary.stop()
        assert _primary_from_data_nodes(cluster, [down, replica.port]) == (
            f"127.0.0.1 {primary.port}")
        assert _primary_from_data_nodes(cluster, [down, primary.port]) == "none"
    finally:
        for server in (replica, lone, primary):
            server.stop()

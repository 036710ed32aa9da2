"""Redis with replicas and automatic failover on loopback: a primary, replicas that follow it,
and sentinels that promote a replica when the primary stops answering. The services reach it
with the ``redis+sentinel://`` URL ``url`` gives (cascade.serving.redis_url). Used by the tests
and by ``cascade up --redis-replicas N``; the same redis-server binary runs every role."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any
from pathlib import Path

import redis
from redis.sentinel import Sentinel

from cascade.tools.redis_server import RedisServer, free_port, redis_server_binary, stderr_text

SERVICE = "cascade"
"""The name the sentinels monitor the primary under."""
REPLICA_PRIORITY = 100
"""Redis's default replica priority, given back to a restarted node once it has synced."""


class RedisSentinel:
    """One sentinel watching the primary on ``primary_port``; it writes its own config file
    (Sentinel rewrites it as it learns), readable by its owner only."""

    def __init__(self, data_dir: Path, primary_port: int, password: str | None = None,
                 quorum: int = 2, down_after_ms: int = 1000, failover_timeout_ms: int = 5000
                 ) -> None:
        self.data_dir, self.primary_port, self.password = data_dir, primary_port, password
        self.quorum, self.down_after_ms = quorum, down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    def _config(self) -> Path:
        lines = [f"port {self.port}", "bind 127.0.0.1", f"dir {self.data_dir}",
                 f"logfile {(self.data_dir / 'sentinel.log').resolve()}",
                 f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary_port} {self.quorum}",
                 f"sentinel down-after-milliseconds {SERVICE} {self.down_after_ms}",
                 f"sentinel failover-timeout {SERVICE} {self.failover_timeout_ms}",
                 f"sentinel parallel-syncs {SERVICE} 1"]
        if self.password:
            lines += [f"sentinel auth-pass {SERVICE} {self.password}",
                      f"requirepass {self.password}"]
        path = self.data_dir / "sentinel.conf"
        path.touch(mode=0o600)
        path.write_text("\n".join(lines) + "\n")
        return path

    def start(self, timeout_s: float = 10.0) -> RedisSentinel:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen([redis_server_binary(), str(self._config()),
                                         "--sentinel"], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE)
        _wait_for_ping(self.process, self.port, self.password, timeout_s)
        return self

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, password=self.password, socket_timeout=1.0,
                           socket_connect_timeout=0.5)

    def stop(self) -> None:
        _stop(self.process)


class RedisHA:
    """A primary, ``replicas`` replicas and ``sentinels`` sentinels (quorum: a majority).
    ``front(name, port)``, if given, puts something in front of each data node and returns the
    port everyone else reaches it on (the chaos suite's fault proxies): replicas, sentinels and
    clients then use only those ports."""

    def __init__(self, data_dir: Path, replicas: int = 2, sentinels: int = 3,
                 password: str | None = None, persistent: bool = True,
                 front: Callable[[str, int], int] | None = None) -> None:
        if replicas < 1 or sentinels < 1:
            raise ValueError("need at least one replica and one sentinel")
        self.data_dir, self.password = data_dir, password
        ports = [free_port() for _ in range(replicas + 1)]
        reach = {p: front(f"redis-{i}", p) if front else p for i, p in enumerate(ports)}
        self.servers = [
            RedisServer(data_dir / f"node-{i}", port, persistent=persistent, password=password,
                        replica_of=reach[ports[0]] if i else None,
                        announce_port=reach[port] if front else None)
            for i, port in enumerate(ports)]
        self.reach = reach
        """Server port -> the port others reach it on."""
        self.sentinels = [RedisSentinel(data_dir / f"sentinel-{i}", reach[ports[0]], password,
                                        quorum=sentinels // 2 + 1) for i in range(sentinels)]

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{auth}{hosts}/{SERVICE}/0"

    def start(self, timeout_s: float = 30.0) -> RedisHA:
        """Every node and sentinel, once the sentinels see every replica in sync; on failure
        whatever started is stopped again."""
        try:
            for server in self.servers:
                server.start()
            for sentinel in self.sentinels:
                sentinel.start()
            self._wait(lambda: self._replicas_seen() >= len(self.servers) - 1, timeout_s,
                       "the sentinels to see every replica in sync")
        except BaseException:
            self.stop()
            raise
        return self

    def primary_port(self) -> int:
        """The port the sentinels name primary now (with a ``front``: its front's port)."""
        address: Any = self.sentinels[0].client().sentinel_get_master_addr_by_name(SERVICE)
        return int(address[1])

    @property
    def process(self) -> subprocess.Popen | None:
        """The process of the server the sentinels name primary now."""
        return self.server_on(self.primary_port()).process

    def sync_client(self) -> redis.Redis:
        """A blocking client of the primary, following it through failovers."""
        sentinel = Sentinel([("127.0.0.1", s.port) for s in self.sentinels],
                            sentinel_kwargs={"password": self.password}, password=self.password,
                            socket_timeout=2.0)
        return sentinel.master_for(SERVICE)

    def server_on(self, port: int) -> RedisServer:
        """The server reached on ``port`` (its own or its front's)."""
        return next(s for s in self.servers if port in (s.port, self.reach[s.port]))

    def wait_for_failover(self, old_port: int, timeout_s: float = 30.0) -> int:
        """The new primary's port, once the sentinels have promoted another server."""
        self._wait(lambda: self.primary_port() != old_port, timeout_s, "a failover")
        return self.primary_port()

    def restart(self, server: RedisServer) -> None:
        """Start a stopped data node again as a replica of the primary the sentinels name now
        (as the Kubernetes start script does: a node that comes back never claims the role it
        had before a failover), not promotable until it has synced: it holds only what it had
        when it stopped, and Sentinel, choosing by the offsets it last saw, could promote it
        over a replica that acknowledged every later round."""
        primary = self.primary_port()
        server.replica_of = None if primary == self.reach[server.port] else primary
        server.replica_priority = 0 if server.replica_of else None
        server.start()
        if server.replica_of:
            threading.Thread(target=self._promotable_once_synced, args=(server,),
                             daemon=True).start()

    def _promotable_once_synced(self, server: RedisServer, timeout_s: float = 300.0) -> None:
        client = redis.Redis(port=server.port, password=self.password, socket_timeout=2.0)
        try:
            self._wait(lambda: client.info("replication").get("master_link_status") == "up",
                       timeout_s, "the restarted replica to sync")
            client.config_set("replica-priority", REPLICA_PRIORITY)
            server.replica_priority = None
        except (RuntimeError, redis.RedisError):
            pass  # it stopped again (the next restart starts it unpromotable anyway)
        finally:
            client.close()

    def _replicas_seen(self) -> int:
        replicas = self.sentinels[0].client().sentinel_slaves(SERVICE)
        return sum(1 for r in replicas if "s_down" not in r.get("flags", "")
                   and r.get("master-link-status") == "ok")

    @staticmethod
    def _wait(condition, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if condition():
                    return
            except redis.RedisError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"timed out after {timeout_s}s waiting for {what}")

    def stop(self) -> None:
        for sentinel in self.sentinels:
            sentinel.stop()
        for server in self.servers:
            server.stop()


def _wait_for_ping(process: subprocess.Popen, port: int, password: str | None,
                   timeout_s: float) -> None:
    client = redis.Redis(port=port, password=password, socket_connect_timeout=0.2)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"redis-server exited: {stderr_text(process)}")
        try:
            if client.ping():
                return
        except redis.ConnectionError:
            time.sleep(0.05)
    _stop(process)
    raise RuntimeError(f"redis-server did not answer on port {port} in {timeout_s}s")


def _stop(process: subprocess.Popen | None) -> None:
    if process and process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

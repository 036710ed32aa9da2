"""``cascade up``: Redis, one verifier, N drafters and the gateway as separate local processes.

Every process binds 127.0.0.1 on a free port (the gateway on the ports asked for; 0: free
ones). A free port can be taken by something else before the process binds it: a process that
fails to bind a port the launcher picked is started again on new ones. ``stop``
sends SIGTERM to each (gateway first, Redis last), waits for the drain, and kills what is left,
so no process outlives the cluster.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis

from cascade.serving.mesh.certs import make_mesh_certs
from cascade.serving.registry import role_key
from cascade.tools.cluster_config import ClusterConfig
from cascade.tools.redis_ha import RedisHA
from cascade.tools.pod_launcher import PodProcess, launch
from cascade.tools.redis_server import RedisServer, free_port


BIND_RETRIES = 3
"""Starts on new ports per process when a port picked for it was taken before it bound it."""
_BIND_FAILURES = ("failed to bind to address", "address already in use")
_PORT_FLAGS = ("--port", "--grpc-port", "--metrics-port")


COMPILE_START_S = 900.0
"""How long a cluster whose verifier compiles its step may take to start."""


@dataclass
class LocalCluster:
    config: ClusterConfig
    processes: dict[str, PodProcess] = field(default_factory=dict)
    redis: RedisServer | RedisHA | None = None
    front: Callable[[str, int], int] | None = None
    """Given (process name, port) of each verifier and Redis data node, puts something in front
    of it and returns the port everyone else reaches it on (the chaos suite's fault proxies);
    verifiers advertise that port."""
    _args: dict[str, list[str]] = field(default_factory=dict)
    _picked: dict[str, int] = field(default_factory=dict)
    """Processes whose ports the launcher picked, with how many times they were started again
    after a failed bind."""
    _log_from: dict[str, int] = field(default_factory=dict)
    """Where each process's log begins for its latest start."""

    @property
    def http_url(self) -> str:
        return self.http_url_of("gateway")

    @property
    def grpc_address(self) -> str:
        return self.grpc_address_of("gateway")

    @property
    def store(self) -> RedisServer | RedisHA:
        """The cluster's Redis (``start`` starts it first)."""
        if self.redis is None:
            raise RuntimeError("the cluster's Redis is not started")
        return self.redis

    def _spawn(self, name: str, args: list[str], picked: bool = False) -> None:
        self._args[name] = args
        if picked:
            self._picked.setdefault(name, 0)
        log_path = self.config.workdir / f"{name}.log"
        self._log_from[name] = log_path.stat().st_size if log_path.exists() else 0
        env = {**os.environ, "CASCADE_REDIS_URL": self.store.url}  # not in the process list
        self.processes[name] = launch(args[0], args[1:], log_path, env,
                                      self.config.cpu_affinity.get(name))

    def start(self, timeout_s: float = 180.0) -> "LocalCluster":
        c = self.config
        c.workdir.mkdir(parents=True, exist_ok=True)
        for log in c.workdir.glob("*.log"):  # this run's logs start afresh; one run kept
            log.replace(log.with_suffix(".log.1"))
        password = secrets.token_urlsafe(24) if c.secure else None
        self.redis = (RedisHA(c.workdir / "redis", c.redis_replicas, password=password,
                              front=self.front).start()
                      if c.redis_replicas else
                      RedisServer(c.workdir / "redis", persistent=True, password=password).start())
        mesh, owner = (self._mesh_files(c.workdir / "mesh")) if c.secure else ([], [])
        pod = ["--dtype", c.dtype, "--threads", str(c.threads_per_pod),
               *(mesh or ["--allow-open"])]
        for i in range(c.num_verifiers):
            name, port = "verifier" if i == 0 else f"verifier-{i}", free_port()
            # Behind a front, others reach the port it was given: it cannot move.
            advertise = (["--advertise", f"127.0.0.1:{self.front(name, port)}"] if self.front
                         else [])
            self._spawn(name, ["verifier_service", "--model", str(c.target),
                               "--port", str(port), "--metrics-port", str(free_port()),
                               *advertise, *pod, *owner, *c.verifier_args],
                        picked=not self.front)
        for i in range(c.num_drafters):
            self._spawn(f"drafter-{i}", ["drafter_service", "--model", str(c.drafter),
                                         "--target-model", str(c.target),
                                         "--port", str(free_port()),
                                         "--metrics-port", str(free_port()), *pod,
                                         *c.drafter_args], picked=True)
        # The gateway serves loopback only, for this machine's user: no API keys.
        self._spawn("gateway", ["gateway", "--model", str(c.target), "--allow-open",
                                "--port", str(c.http_port or free_port()),
                                "--grpc-port", str(c.grpc_port or free_port()), *mesh, *owner,
                                *c.gateway_args], picked=not (c.http_port or c.grpc_port))
        try:
            self._wait_ready(max(timeout_s, COMPILE_START_S) if self._compiles() else timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _compiles(self) -> bool:
        """Whether the verifier compiles its step (``--compile``, or ``CASCADE_COMPILE`` in
        the environment the pods inherit): a first compile takes minutes on a CPU."""
        args = list(self.config.verifier_args)
        mode = (args[args.index("--compile") + 1] if "--compile" in args
                else os.environ.get("CASCADE_COMPILE", "off"))
        return mode != "off"

    @staticmethod
    def _mesh_files(folder: Path) -> tuple[list[str], list[str]]:
        """(flags every service gets: mutual TLS; flags gateway and verifiers get: the session
        key of owner tags), made fresh in ``folder``."""
        make_mesh_certs(folder)
        key = folder / "session.key"
        key.touch(mode=0o600)
        key.write_text(secrets.token_hex(32))
        return ["--tls-dir", str(folder)], ["--session-key-file", str(key)]

    def _wait_ready(self, timeout_s: float, pod: str | None = None,
                    gateway: str = "gateway", name: str | None = None) -> None:
        """Until every pod is registered (or ``pod``) and ``gateway`` is ready; fails if a
        process (only ``name``, if given: others may be down on purpose) exits. Redis errors (a
        failover under way) are waited out."""
        client = self.store.sync_client()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._check_alive(name)
            try:
                registered = (self._all_registered(client) if pod is None
                              else self._registered(client, self._port_of(pod)))
            except redis.RedisError:
                registered = False
            if registered and self._gateway_ready(self.http_url_of(gateway)):
                return
            time.sleep(0.2)
        raise TimeoutError(f"cluster not ready after {timeout_s}s; see {self.config.workdir}")

    @staticmethod
    def _entries_on(client, port: str) -> list[tuple[str, bytes]]:
        """(registry key, address) of every pod entry on ``port``."""
        return [(role_key(role), address) for role in ("drafter", "verifier")
                for address in client.hkeys(role_key(role))
                if address.decode().endswith(f":{port}")]

    def _registered(self, client, port: str) -> bool:
        return bool(self._entries_on(client, port))

    def _all_registered(self, client) -> bool:
        return (client.hlen(role_key("drafter")) >= self.config.num_drafters
                and client.hlen(role_key("verifier")) >= self.config.num_verifiers)

    def name_of(self, address: str) -> str:
        """The process serving ``address`` (host:port of a drafter or verifier)."""
        port = address.rsplit(":", 1)[1]
        for name in self._args:
            if not name.startswith("gateway") and self.address_of(name).endswith(f":{port}"):
                return name
        raise KeyError(f"no process of this cluster serves {address}")

    def add_gateway(self, name: str = "gateway-1", timeout_s: float = 60.0) -> tuple[str, str]:
        """Start another gateway on free ports beside the first (same Redis, same pods, same
        flags); returns its HTTP URL and gRPC address."""
        args = list(self._args["gateway"])
        args[args.index("--port") + 1] = str(free_port())
        args[args.index("--grpc-port") + 1] = str(free_port())
        self._spawn(name, args, picked=True)
        self._wait_ready(timeout_s, gateway=name)
        return self.http_url_of(name), self.grpc_address_of(name)

    def http_url_of(self, name: str) -> str:
        """The HTTP URL of gateway ``name``."""
        args = self._args[name]
        return f"http://127.0.0.1:{args[args.index('--port') + 1]}"

    def grpc_address_of(self, name: str) -> str:
        """host:port of gateway ``name``'s gRPC API."""
        args = self._args[name]
        return f"127.0.0.1:{args[args.index('--grpc-port') + 1]}"

    def metrics_urls(self) -> dict[str, str]:
        """Each process's Prometheus /metrics URL, by process name (the gateway's on its HTTP
        port)."""
        urls = {}
        for name, args in self._args.items():
            if name.startswith("gateway"):
                urls[name] = f"{self.http_url_of(name)}/metrics"
            elif "--metrics-port" in args:
                urls[name] = f"http://127.0.0.1:{args[args.index('--metrics-port') + 1]}/metrics"
        return urls

    def address_of(self, name: str) -> str:
        """host:port others reach pod ``name`` (a drafter or verifier process) on."""
        args = self._args[name]
        if "--advertise" in args:
            return args[args.index("--advertise") + 1]
        return f"127.0.0.1:{args[args.index('--port') + 1]}"

    def _port_of(self, pod: str) -> str:
        return self.address_of(pod).rsplit(":", 1)[1]

    def restart(self, name: str, timeout_s: float = 120.0) -> None:
        """Start process ``name`` again with its first arguments (after it died or was
        killed), and wait until it is registered again (pods) or ready (the gateway)."""
        process = self.processes[name]
        if process.poll() is None:
            raise RuntimeError(f"{name} is still running")
        args = self._args[name]
        if name.startswith("gateway"):
            self._spawn(name, args)
            self._wait_ready(timeout_s, gateway=name, name=name)
            return
        self._unregister(self._port_of(name))  # the dead pod's entry lives until it expires
        self._spawn(name, args)
        self._wait_ready(timeout_s, pod=name, name=name)

    def _unregister(self, port: str) -> None:
        client = self.store.sync_client()
        try:
            for key, address in self._entries_on(client, port):
                client.hdel(key, address)
        except redis.RedisError:
            pass  # Redis is failing over: the entry expires on its own
        finally:
            client.close()

    @staticmethod
    def _gateway_ready(url: str) -> bool:
        try:
            return httpx.get(f"{url}/ready", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    def _check_alive(self, only: str | None = None) -> None:
        for name, process in list(self.processes.items()):
            if process.poll() is not None and only in (None, name):
                with (self.config.workdir / f"{name}.log").open() as file:
                    file.seek(self._log_from.get(name, 0))
                    log = file.read()[-2000:]
                if self._port_taken(name, log):
                    self._start_on_new_ports(name)
                    continue
                raise RuntimeError(f"{name} exited with code {process.returncode}:\n{log}")

    def _port_taken(self, name: str, log: str) -> bool:
        """Whether ``name`` died because a port the launcher picked for it was taken meanwhile
        (and may be started again on new ones)."""
        return (self._picked.get(name, BIND_RETRIES) < BIND_RETRIES
                and any(failure in log.lower() for failure in _BIND_FAILURES))

    def _start_on_new_ports(self, name: str) -> None:
        args = list(self._args[name])
        for flag in _PORT_FLAGS:
            if flag in args:
                args[args.index(flag) + 1] = str(free_port())
        self._picked[name] += 1
        with (self.config.workdir / f"{name}.log").open("a") as log:
            log.write(f"\n[launcher] a port was taken before {name} bound it; starting it "
                      f"again on new ports\n")
        self._spawn(name, args)

    def stop(self, timeout_s: float = 20.0) -> None:
        order = [*[n for n in self.processes if n.startswith("gateway")],
                 *[n for n in self.processes if n.startswith("drafter")],
                 *[n for n in self.processes if n.startswith("verifier")]]
        for name in order:
            process = self.processes.get(name)
            if process and process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in filter(None, map(self.processes.get, order)):
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self.redis:
            self.redis.stop()

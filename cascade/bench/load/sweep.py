"""``cascade bench load``: the verifier under concurrent sessions.

For each mode — speculative with the verifier unbatched (one block per pass), speculative batched
(the engine), target-only batched (k = 0 through the same engine: what a continuous-batching
server gives), fixed k = 1, 2, 4, the "auto" schedule (the verifier's goodput planner) and token
trees (``tree_nodes`` nodes, depth k; verified whole or planned) with the drafters as shipped —
a local cluster runs as separate processes, verifier and drafter pinned to different cores,
gateway, Redis and this client on the drafter's core; the modes take turns at each number of
sessions, ``repeats`` times. For each number of sessions, that many streaming clients send
requests back to back through the gateway's gRPC API for a fixed window, after which requests
still running are cancelled; the table reports committed tokens per second (tokens that reached
clients within the window), inter-token latency p50/p99 over every token of every session, time
to first token and errors (repeated runs pooled). A soak run keeps the largest number of clients
going for longer and counts errors.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc

from cascade.bench.measure import percentile
from cascade.bench.prompts import DOMAINS
from cascade.bench.compare.run import machine
from cascade.bench.compare.services import NO_MEMORY, pin_all_threads, pinning, place_helpers
from cascade.tools.local_cluster import LocalCluster
from cascade.tools.cluster_config import ClusterConfig
from cascade.v1 import gateway_pb2, gateway_pb2_grpc


@dataclass(frozen=True)
class Mode:
    key: str
    name: str
    k: int
    verifier_args: tuple[str, ...] = ()
    drafter_args: tuple[str, ...] = ("--speculate", "off")
    schedule: str = "fixed"
    """The requests' draft_schedule."""
    tree_nodes: int | None = None
    """The requests' draft_tree_nodes (None: unset, chains)."""
    tree_expansion: str = ""
    """The requests' draft_tree_expansion (empty: dynamic)."""
    method: str = "model"
    """The requests' draft_method (empty: the server's default)."""


SSD_ARGS = ("--speculate", "ahead", "--speculate-max-sessions", "64")
"""The drafter of mode batched-ssd: drafting during verification for every session."""


@dataclass(frozen=True)
class LoadConfig:
    target: Path
    drafter: Path
    out: Path
    k: int = 4
    sessions: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    max_tokens: int = 32
    window_s: float = 20.0
    soak_s: float = 60.0
    max_wait_ms: float | None = None
    """The batched verifier's --max-wait-ms (None: its default)."""
    only: tuple[str, ...] = ()
    """Run only these modes (all when empty; see ``modes``)."""
    domains: tuple[str, ...] = ()
    """Prompt domains the clients send (cascade.bench.prompts; all when empty)."""
    dtype: str = "float32"
    fixed_k: tuple[int, ...] = (1, 2, 4)
    """The fixed-k modes beside auto (drafters as shipped)."""
    tree_nodes: int = 16
    """Nodes per round of the "tree" mode (depth k)."""
    repeats: int = 1
    """Runs per mode and load, the modes taking turns in each: the table pools them, and the
    comparison gives each ratio's range over the runs."""

    def modes(self) -> list[Mode]:
        batched = () if self.max_wait_ms is None else ("--max-wait-ms", str(self.max_wait_ms))
        shipped = ()  # the drafter's defaults: drafting during verification included
        modes = [Mode("unbatched", f"speculative k={self.k}, unbatched", self.k,
                      ("--no-batching",)),
                 Mode("batched", f"speculative k={self.k}, batched", self.k, batched),
                 Mode("batched-ssd", f"speculative k={self.k}, batched, drafting during "
                      "verification", self.k, batched, SSD_ARGS),
                 Mode("target-only", "target-only, batched", 0, batched),
                 *[Mode(f"fixed-k{k}", f"fixed k={k}", k, batched, shipped)
                   for k in self.fixed_k],
                 Mode("auto", f"auto (k <= {self.k})", self.k, batched, shipped, "auto"),
                 Mode("default", "the defaults (draft_method auto, schedule auto)", self.k,
                      batched, shipped, "auto", method=""),
                 Mode("tree", f"trees ({self.tree_nodes} nodes, depth {self.k})", self.k,
                      batched, shipped, "fixed", self.tree_nodes),
                 Mode("tree-auto", f"auto trees (<= {self.tree_nodes} nodes)", self.k,
                      batched, shipped, "auto", self.tree_nodes),
                 Mode("tree-cape", f"CAPE trees ({self.tree_nodes} nodes, depth {self.k})",
                      self.k, batched, shipped, "fixed", self.tree_nodes, "confidence"),
                 Mode("tree-cape-auto", f"auto CAPE trees (<= {self.tree_nodes} nodes)",
                      self.k, batched, shipped, "auto", self.tree_nodes, "confidence")]
        keys = [m.key for m in modes]
        unknown = set(self.only) - set(keys)
        if unknown:
            raise ValueError(f"unknown modes {sorted(unknown)}; use {', '.join(keys)}")
        return [m for m in modes if not self.only or m.key in self.only]


@dataclass
class Point:
    mode: str
    sessions: int
    window_s: float
    tokens: int = 0
    requests: int = 0
    errors: list[str] = field(default_factory=list)
    itl_s: list[float] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list)
    soak: bool = False
    drafted: list[int] = field(default_factory=list)
    """Drafted tokens verified in each round (the plan's choice under auto)."""
    repeat: int | None = None
    """Which of the repeated runs this is (None: every run pooled)."""

    def row(self) -> dict:
        return {"mode": self.mode, "sessions": self.sessions, "soak": self.soak,
                "window_s": self.window_s, "repeat": self.repeat,
                "tokens_per_s": round(self.tokens / self.window_s, 2),
                "itl_p50_ms": round(1000 * percentile(self.itl_s, 0.5), 1),
                "itl_p99_ms": round(1000 * percentile(self.itl_s, 0.99), 1),
                "ttft_p50_ms": round(1000 * percentile(self.ttft_s, 0.5), 1),
                "requests": self.requests, "errors": len(self.errors),
                "mean_drafted": round(sum(self.drafted) / max(len(self.drafted), 1), 2),
                "rounds_at_0": round(self.drafted.count(0) / max(len(self.drafted), 1), 2)}


def pooled(points: list[Point]) -> Point:
    """One point of several runs of the same mode and load: their tokens over their summed
    windows, percentiles over every gap of every run."""
    first = points[0]
    whole = Point(first.mode, first.sessions, sum(p.window_s for p in points), soak=first.soak)
    for point in points:
        whole.tokens += point.tokens
        whole.requests += point.requests
        for name in ("errors", "itl_s", "ttft_s", "drafted"):
            getattr(whole, name).extend(getattr(point, name))
    return whole


def _prompts(domains: tuple[str, ...] = ()) -> list[tuple[str, bool]]:
    return [(text, d.chat) for d in DOMAINS if not domains or d.name in domains
            for text in d.prompts]


async def _client(stub, point: Point, index: int, mode: Mode, max_tokens: int,
                  domains: tuple[str, ...]) -> None:
    """Requests back to back until cancelled."""
    prompts = _prompts(domains)
    while True:
        text, chat = prompts[(index + point.requests) % len(prompts)]
        request = gateway_pb2.GenerateRequest(prompt=text, chat=chat, num_draft_tokens=mode.k,
                                              temperature=0.0, max_tokens=max_tokens,
                                              draft_schedule=mode.schedule,
                                              draft_method=mode.method,
                                              draft_tree_nodes=mode.tree_nodes,
                                              draft_tree_expansion=mode.tree_expansion)
        started = last = time.perf_counter()
        try:
            async for response in stub.Generate(request, timeout=300):
                now, count = time.perf_counter(), len(response.token_ids)
                if not count:
                    continue
                point.drafted.append(response.stats.num_drafted)
                if last == started:
                    point.ttft_s.append(now - started)
                else:
                    point.itl_s.extend([(now - last) / count] * count)
                point.tokens += count
                last = now
            point.requests += 1
        except grpc.aio.AioRpcError as exc:
            point.errors.append(f"{exc.code().name}: {exc.details()}")


async def measure_point(address: str, mode: Mode, sessions: int, window_s: float,
                        max_tokens: int, soak: bool = False, domains: tuple[str, ...] = ()
                        ) -> Point:
    """``sessions`` clients for ``window_s``; requests still running then are cancelled (their
    tokens so far count, as they reached the client within the window)."""
    point = Point(mode.name, sessions, window_s, soak=soak)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        clients = [asyncio.create_task(_client(stub, point, i, mode, max_tokens, domains))
                   for i in range(sessions)]
        await asyncio.sleep(window_s)
        for client in clients:
            client.cancel()
        await asyncio.gather(*clients, return_exceptions=True)
    await asyncio.sleep(1.0)  # let the pods finish the cancelled sessions' last steps
    return point


def _start(config: LoadConfig, mode: Mode, pins: dict) -> LocalCluster:
    cluster = LocalCluster(ClusterConfig(
        config.target, config.drafter, http_port=0, grpc_port=0,
        workdir=config.out / f"cluster-{mode.key}", cpu_affinity=pins, dtype=config.dtype,
        verifier_args=mode.verifier_args, drafter_args=mode.drafter_args,
        gateway_args=NO_MEMORY)).start()  # clients cycle through a few prompts
    place_helpers(cluster, pins, verifier_waits=False)  # helpers share the drafter's core
    asyncio.run(measure_point(cluster.grpc_address, mode, 1, 4.0, 16,
                              domains=config.domains))  # warm up (and the plan's estimates)
    return cluster


def _settings(config: LoadConfig) -> dict[str, str]:
    """The run's settings as the result records them: a path by its last part (the model
    folders' names), not where this machine keeps it."""
    return {k: v.name if isinstance(v, Path) else str(v) for k, v in asdict(config).items()}


def run_load(config: LoadConfig, progress=lambda point: None) -> dict:
    """Every mode's cluster runs at once (idle ones cost nothing but memory) and the modes take
    turns at each number of sessions (``repeats`` times), so the rows of one size are measured
    minutes apart at most, not a whole sweep apart."""
    modes, pins = config.modes(), pinning()
    clusters: dict[str, LocalCluster] = {}
    points: list[Point] = []
    everything = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    try:
        for mode in modes:
            clusters[mode.key] = _start(config, mode, pins)
        for sessions in config.sessions:
            for repeat in range(config.repeats):
                for mode in modes:
                    points.append(asyncio.run(measure_point(
                        clusters[mode.key].grpc_address, mode, sessions, config.window_s,
                        config.max_tokens, domains=config.domains)))
                    points[-1].repeat = repeat
                    progress(points[-1])
        for mode in modes:
            if mode.key == "batched" and config.soak_s > 0:
                points.append(asyncio.run(measure_point(
                    clusters[mode.key].grpc_address, mode, max(config.sessions), config.soak_s,
                    config.max_tokens, soak=True, domains=config.domains)))
                progress(points[-1])
    finally:
        for cluster in clusters.values():
            cluster.stop()
        if everything:  # place_helpers pinned this process to one core: give it all back
            pin_all_threads(os.getpid(), everything)
    order = {m.name: i for i, m in enumerate(modes)}
    points.sort(key=lambda p: (order[p.mode], p.soak, p.sessions, p.repeat or 0))
    cells: dict[tuple, list[Point]] = {}
    for point in points:
        cells.setdefault((point.mode, point.soak, point.sessions), []).append(point)
    result = {"cpu": machine(), "config": _settings(config),
              "points": [pooled(cell).row() for cell in cells.values()],
              "errors": sorted({e for p in points for e in p.errors})[:20]}
    if config.repeats > 1:
        result["runs"] = [p.row() for p in points]
    return result

"""``cascade bench-load``: the verifier under concurrent sessions.

For each mode — speculative with the verifier unbatched (one block per pass), speculative batched
(the engine), target-only batched (k = 0 through the same engine: what a continuous-batching
server gives), fixed k = 1, 2, 4, the "auto" schedule (the verifier's goodput planner) and token
trees (``tree_nodes`` nodes, depth k; verified whole or planned) with the drafters as shipped —
a local cluster runs as separate processes, verifier and drafter pinned to different cores, gateway, Redis and this client on the drafter's core; the modes take turns at
each number of sessions. For each number of
sessions, that many streaming clients send requests back to back through the gateway's gRPC API
for a fixed window, after which requests still running are cancelled; the table reports
committed tokens per second (tokens that reached clients within the window), inter-token latency p50/p99 over every token of every session, time to first
token and errors. A soak run keeps the largest number of clients going for longer and counts
errors.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc

from cascade.bench.measure import percentile
from cascade.bench.prompts import DOMAINS
from cascade.bench.run import machine
from cascade.bench.services import pin_all_threads, pinning, place_helpers
from cascade.tools.local_cluster import ClusterConfig, LocalCluster
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

    def row(self) -> dict:
        return {"mode": self.mode, "sessions": self.sessions, "soak": self.soak,
                "window_s": self.window_s,
                "tokens_per_s": round(self.tokens / self.window_s, 2),
                "itl_p50_ms": round(1000 * percentile(self.itl_s, 0.5), 1),
                "itl_p99_ms": round(1000 * percentile(self.itl_s, 0.99), 1),
                "ttft_p50_ms": round(1000 * percentile(self.ttft_s, 0.5), 1),
                "requests": self.requests, "errors": len(self.errors),
                "mean_drafted": round(sum(self.drafted) / max(len(self.drafted), 1), 2),
                "rounds_at_0": round(self.drafted.count(0) / max(len(self.drafted), 1), 2)}


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
                                              draft_tree_nodes=mode.tree_nodes,
                                              draft_tree_expansion=mode.tree_expansion)
        started = last = time.perf_counter()
        try:
            async for response in stub.Generate(request, timeout=300):
                now, count = time.perf_counter(), len(response.token_ids)
                if not count:
                    continue
                point.drafted.append(response.num_drafted)
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
        verifier_args=mode.verifier_args, drafter_args=mode.drafter_args)).start()
    place_helpers(cluster, pins, verifier_waits=False)  # helpers share the drafter's core
    asyncio.run(measure_point(cluster.grpc_address, mode, 1, 4.0, 16,
                              domains=config.domains))  # warm up (and the plan's estimates)
    return cluster


def run_load(config: LoadConfig, progress=lambda point: None) -> dict:
    """Every mode's cluster runs at once (idle ones cost nothing but memory) and the modes take
    turns at each number of sessions, so the rows of one size are measured minutes apart at
    most, not a whole sweep apart."""
    modes, pins = config.modes(), pinning()
    clusters: dict[str, LocalCluster] = {}
    points: list[Point] = []
    everything = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    try:
        for mode in modes:
            clusters[mode.key] = _start(config, mode, pins)
        for sessions in config.sessions:
            for mode in modes:
                points.append(asyncio.run(measure_point(
                    clusters[mode.key].grpc_address, mode, sessions, config.window_s,
                    config.max_tokens, domains=config.domains)))
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
    points.sort(key=lambda p: (order[p.mode], p.soak, p.sessions))
    return {"cpu": machine(), "config": {
        k: str(v) for k, v in asdict(config).items()}, "points": [p.row() for p in points],
        "errors": sorted({e for p in points for e in p.errors})[:20]}


def table(result: dict) -> str:
    lines = ["| mode | sessions | tokens/s | ITL p50 ms | ITL p99 ms | TTFT p50 ms | requests "
             "| errors | mean drafted | rounds at 0 |", "|---|---|---|---|---|---|---|---|---|---|"]
    for p in result["points"]:
        sessions = f"{p['sessions']} (soak, {p['window_s']:.0f} s)" if p["soak"] else p["sessions"]
        lines.append(f"| {p['mode']} | {sessions} | {p['tokens_per_s']} | {p['itl_p50_ms']}"
                     f" | {p['itl_p99_ms']} | {p['ttft_p50_ms']} | {p['requests']} "
                     f"| {p['errors']} | {p.get('mean_drafted', '-')} "
                     f"| {p.get('rounds_at_0', '-')} |")
    return "\n".join(lines)


def comparison(result: dict) -> str:
    """auto beside the best of target-only and the fixed-k modes, per number of sessions."""
    rows = [p for p in result["points"] if not p["soak"]]
    names = {p["mode"] for p in rows}
    auto = next((n for n in names if n.startswith("auto (")), None)  # chains; not auto trees
    rivals = [n for n in names if n == "target-only, batched" or n.startswith("fixed k=")]
    if auto is None or not rivals:
        return ""
    lines = ["| sessions | target-only | best fixed k | auto | auto / best | ITL p99 auto / "
             "target-only |", "|---|---|---|---|---|---|"]
    for sessions in sorted({p["sessions"] for p in rows}):
        at = {p["mode"]: p for p in rows if p["sessions"] == sessions}
        fixed = [at[n] for n in rivals if n.startswith("fixed k=") and n in at]
        best_fixed = max(fixed, key=lambda p: p["tokens_per_s"], default=None)
        target = at.get("target-only, batched")
        best = max([p["tokens_per_s"] for p in (target, best_fixed) if p], default=0)
        mine = at.get(auto)
        if mine is None or not best:
            continue
        itl = (f"{mine['itl_p99_ms'] / target['itl_p99_ms']:.2f}"
               if target and target["itl_p99_ms"] else "-")
        fixed_text = (f"{best_fixed['tokens_per_s']} ({best_fixed['mode'].split()[-1]})"
                      if best_fixed else "-")
        lines.append(f"| {sessions} | {target['tokens_per_s'] if target else '-'} | "
                     f"{fixed_text} | {mine['tokens_per_s']} | "
                     f"{mine['tokens_per_s'] / best:.2f} | {itl} |")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for mode in dict.fromkeys(p["mode"] for p in result["points"]):
        rows = [p for p in result["points"] if p["mode"] == mode and not p["soak"]]
        left.plot([p["sessions"] for p in rows], [p["tokens_per_s"] for p in rows], "o-",
                  label=mode)
        right.plot([p["sessions"] for p in rows], [p["itl_p50_ms"] for p in rows], "o-",
                   label=mode)
    for ax, label in ((left, "committed tokens/s (verifier)"), (right, "ITL p50 (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent streaming sessions")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    left.legend(fontsize=8)
    fig.suptitle(f"Verifier under load ({result['cpu']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def save(result: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "load.json", out / "load.md", out / "load.png"]
    paths[0].write_text(json.dumps(result, indent=1))
    paths[1].write_text(table(result) + "\n\n" + comparison(result) + "\n")
    plot(result, paths[2])
    return paths

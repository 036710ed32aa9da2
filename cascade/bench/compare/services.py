"""Cascade as services on loopback: Redis, verifier, drafter and gateway as separate processes,
verifier and drafter pinned to different cores (one torch thread each) so they behave like
separate machines; generations stream through the gateway's gRPC API on one channel. Rows with
k > 0 use ``draft_schedule: fixed`` (they compare drafting methods at k; ``cascade bench load``
compares the planner's ``auto``)."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc

from cascade.bench.compare.inprocess import Job, MethodRun, measure_method, params_for
from cascade.bench.measure import Trace, peak_rss_mb
from cascade.bench.prompts import BenchPrompt
from cascade.tools.local_cluster import LocalCluster
from cascade.tools.cluster_config import ClusterConfig
from cascade.v1 import gateway_pb2, gateway_pb2_grpc


@dataclass
class ServicesResult:
    methods: list[MethodRun]
    peak_rss_mb: dict[str, float | None]
    pinning: str


def pinning() -> dict[str, frozenset[int]]:
    """Verifier on the first core, drafter on the second (nothing pinned on one core)."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cores) < 2:
        return {}
    return {"verifier": frozenset({cores[0]}), "drafter-0": frozenset({cores[1]})}


def pin_all_threads(pid: int, cores: frozenset[int]) -> None:
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except (ProcessLookupError, PermissionError):
            pass  # a thread that just ended


def place_helpers(cluster: LocalCluster, pins: dict[str, frozenset[int]], verifier_waits: bool
                  ) -> str:
    """Put the gateway, Redis and this client (a third machine in a deployment) on the core
    that idles in this mode: the verifier's when it waits for a lock-step drafter, else the
    drafter's (idle in target-only decoding; pre-drafting off the critical path when it
    drafts during verification)."""
    if not pins:
        return "not pinned"
    core = pins["verifier"] if verifier_waits else pins["drafter-0"]
    pids = [cluster.processes["gateway"].pid, os.getpid()]
    if cluster.redis and cluster.redis.process:
        pids.append(cluster.redis.process.pid)
    for pid in pids:
        pin_all_threads(pid, core)
    return f"gateway, redis and client on core {sorted(core)}"


def service_trace(stub, prompt: BenchPrompt, job: Job, k: int, sampling: bool) -> Trace:
    params = params_for(job, sampling, eos=None)  # the gateway adds the model's eos
    request = gateway_pb2.GenerateRequest(
        prompt=prompt.text, num_draft_tokens=k, chat=prompt.chat, draft_schedule="fixed",
        max_tokens=params.max_new_tokens, temperature=params.temperature, seed=params.seed)
    trace = Trace(prompt.domain)
    started = time.perf_counter()
    for response in stub.Generate(request, timeout=600):
        if response.prompt_tokens != len(prompt.token_ids):
            raise RuntimeError("the gateway tokenized the prompt differently from the benchmark")
        if not response.token_ids:
            continue
        trace.chunk(time.perf_counter() - started, list(response.token_ids))
        stats = response.stats
        trace.round(stats.num_drafted, stats.num_accepted, stats.draft_us / 1e6,
                    stats.verify_us / 1e6, len(response.token_ids))
        if stats.round_us:
            overhead = stats.round_us - stats.draft_us - stats.verify_us
            trace.overhead_s.append(overhead / 1e6)
    trace.elapsed_s = time.perf_counter() - started
    return trace


def _cluster_rss(cluster: LocalCluster) -> dict[str, float | None]:
    rss = {name: peak_rss_mb(p.pid) for name, p in cluster.processes.items()}
    if cluster.redis and cluster.redis.process:
        rss["redis"] = peak_rss_mb(cluster.redis.process.pid)
    return rss


NO_MEMORY = ("--speculation-memory", "off")
"""Benchmarks run a prompt several times (warm-up, repeats): with the speculation memory on,
every run after the first would replay the first's text instead of measuring the drafter."""


@contextmanager
def pinned_cluster(target: Path, drafter: Path, workdir: Path,
                   drafter_args: tuple[str, ...] = (),
                   gateway_args: tuple[str, ...] = NO_MEMORY
                   ) -> Iterator[tuple[LocalCluster, dict[str, frozenset[int]]]]:
    """A local cluster with the verifier and the drafter on cores of their own (``pinning``),
    the speculation memory off unless ``gateway_args`` say otherwise, and Redis started empty
    (the local cluster keeps Redis's data in the workdir: a rerun in the same workdir would
    otherwise find the memory and sessions an earlier run left); on the way out this process
    gets all its cores back and the cluster stops."""
    shutil.rmtree(workdir / "redis", ignore_errors=True)
    pins = pinning()
    config = ClusterConfig(target, drafter, http_port=0, grpc_port=0,
                           workdir=workdir, cpu_affinity=pins, drafter_args=drafter_args,
                           gateway_args=gateway_args)
    cluster = LocalCluster(config).start()
    everything = frozenset(os.sched_getaffinity(0))
    try:
        yield cluster, pins
    finally:
        pin_all_threads(os.getpid(), everything)
        cluster.stop()


def run_services(job: Job, workdir: Path, progress: Callable[[], None] | None = None
                 ) -> ServicesResult:
    if not job.k:
        raise ValueError("the services need a draft length (k > 0)")
    methods = [MethodRun("target only (verifier, k=0)", "services", False, 0),
               MethodRun(f"Cascade services (k={job.k})", "services", False, job.k),
               MethodRun(f"Cascade services (k={job.k})", "services", True, job.k)]
    helpers = {}
    with pinned_cluster(job.target, job.drafter, workdir) as (cluster, pins), \
            grpc.insecure_channel(cluster.grpc_address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        service_trace(stub, job.prompts[0], job, job.k, False)  # warm up
        for m in methods:
            # the cluster's drafter speculates (its default), so the verifier never waits
            helpers[m.k > 0] = place_helpers(cluster, pins, verifier_waits=False)
            measure_method(m, job, lambda p, m=m: service_trace(stub, p, job, m.k,
                                                                m.sampling), progress)
        rss = _cluster_rss(cluster)
    described = ", ".join(f"{name} on core {sorted(cores)}" for name, cores in pins.items())
    if pins:
        described += (f"; target-only: {helpers.get(False)}; speculative: {helpers.get(True)}")
    return ServicesResult(methods, rss, described or "not pinned (one core)")

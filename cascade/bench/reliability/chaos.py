"""Chaos under load: many concurrent streaming clients against a local cluster of real processes
(2 gateways, 2 verifiers, 3 drafters, Redis with 2 replicas and 3 sentinels) while a random
fault hits every ~15 s: kill -9 of any pod or of the Redis primary (the pod started again a few
seconds later, as Kubernetes would), SIGSTOP of a pod for 20 s (a hung pod), a dropped or
stalled link between a drafter and the verifiers or between a gateway and Redis (through TCP
proxies the suite puts in front of every verifier and Redis node, faulting only the named
process's connections).

Clients resume a broken or silent stream on the other gateway after the last round they
received (``cascade.tools.client.stream_generation``, as docs/reliability.md documents). Checks:
every session completes, its greedy text equals the no-fault run's, its round ids are 1..n
(none lost, none repeated); recovery per fault = the time until every stream live at the fault
received a round again.

    cascade bench chaos --minutes 5 --streams 32 --out docs/reliability.md
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

import grpc
from pydantic import BaseModel, Field

from cascade.bench.reliability.chaos_faults import Injector
from cascade.bench.reliability.chaos_report import Outcome, Session, recovery, table
from cascade.bench.prompts import DOMAINS
from cascade.serving.settings_cli import settings_command
from cascade.tools.client import stream_generation
from cascade.tools.fault_proxy import FaultProxy
from cascade.tools.local_cluster import LocalCluster
from cascade.tools.pairs import PairName, default_pair
from cascade.tools.cluster_config import ClusterConfig

Kind = Literal["kill-gateway", "kill-verifier", "kill-drafter", "kill-redis-primary",
               "hang-gateway", "hang-verifier", "hang-drafter",
               "drop-drafter-verifier", "stall-drafter-verifier",
               "drop-gateway-redis", "stall-gateway-redis"]
KINDS: tuple[str, ...] = get_args(Kind)
PROMPTS = tuple(p for domain in DOMAINS for p in domain.prompts)


@dataclass(frozen=True)
class ChaosConfig:
    streams: int = 32
    duration_s: float = 300.0
    """How long clients start new sessions (those running then finish)."""
    fault_every_s: float = 15.0
    """Mean time between faults (each gap drawn from +-30 % of it)."""
    hang_s: float = 20.0
    stall_s: float = 10.0
    drop_s: float = 2.0
    """How long a dropped link refuses new connections."""
    restart_after_s: float = 3.0
    """A killed process is started again this long after it died."""
    max_tokens: int = 48
    idle_timeout_s: float = 8.0
    """A client resumes elsewhere after this long without a round."""
    kinds: tuple[str, ...] = KINDS
    in_order: bool = False
    """Faults in the order of ``kinds`` (cycling) instead of at random."""
    seed: int = 0


class ChaosCluster:
    """The local cluster, with a fault proxy in front of each verifier and Redis node."""

    def __init__(self, target: Path, drafter: Path, workdir: Path, lease_s: float = 3.0) -> None:
        self.proxies: dict[str, FaultProxy] = {}
        config = ClusterConfig(target, drafter, num_drafters=3, num_verifiers=2,
                               redis_replicas=2, http_port=0, grpc_port=0,
                               workdir=workdir,
                               gateway_args=("--session-lease-s", str(lease_s),
                                             "--redis-wait-replicas", "1"))
        self.cluster = LocalCluster(config, front=self._front)

    def _front(self, name: str, port: int) -> int:
        self.proxies[name] = FaultProxy(port).start()
        return self.proxies[name].port

    def start(self) -> ChaosCluster:
        try:
            self.cluster.start()
            self.cluster.add_gateway("gateway-1")
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def gateways(self) -> list[str]:
        return [self.cluster.grpc_address_of(name) for name in ("gateway", "gateway-1")]

    def names(self, role: str) -> list[str]:
        return [n for n in self.cluster.processes if n.startswith(role)]

    def stop(self) -> None:
        self.cluster.stop()
        for proxy in self.proxies.values():
            proxy.stop()


class Clients:
    """``streams`` threads, each starting sessions one after another until a deadline."""

    def __init__(self, gateways: list[str], config: ChaosConfig) -> None:
        self.gateways, self.config = gateways, config
        self.sessions: list[Session] = []
        self.lock = threading.Lock()

    def generate(self, prompt: int, gateways: list[str], on_response=None,
                 session: Session | None = None) -> list[int]:
        on_resume = (lambda exc: session.resumes.append(f"{exc.code().name}: {exc.details()}")
                     ) if session else None
        return stream_generation(gateways, PROMPTS[prompt], self.config.max_tokens, 4,
                                 chat=False, on_response=on_response, timeout_s=600,
                                 max_resumes=40, idle_timeout_s=self.config.idle_timeout_s,
                                 on_resume=on_resume).token_ids

    def references(self) -> dict[int, list[int]]:
        """Each prompt's greedy tokens without a fault."""
        return {i: self.generate(i, self.gateways) for i in range(len(PROMPTS))}

    def run(self, until: float) -> None:
        threads = [threading.Thread(target=self._stream, args=(i, until), daemon=True)
                   for i in range(self.config.streams)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def _stream(self, index: int, until: float) -> None:
        rng = random.Random(self.config.seed * 1000 + index)
        gateways = self.gateways[index % 2:] + self.gateways[:index % 2]
        while time.monotonic() < until:
            session = Session(rng.randrange(len(PROMPTS)), time.monotonic())
            with self.lock:
                self.sessions.append(session)
            try:
                session.tokens = self.generate(session.prompt, gateways, lambda r: (
                    session.rounds.append((r.round, time.monotonic()))), session)
            except grpc.RpcError as exc:
                session.error = f"{exc.code().name}: {exc.details()}"
            session.ended = time.monotonic()


def run_chaos(chaos: ChaosCluster, config: ChaosConfig, progress=print) -> Outcome:
    clients = Clients(chaos.gateways, config)
    references = clients.references()
    injector = Injector(chaos, config)
    until = time.monotonic() + config.duration_s
    faults = threading.Thread(target=injector.run, args=(until,), daemon=True)
    faults.start()
    watcher = threading.Thread(target=_progress, args=(clients, injector, until, progress),
                               daemon=True)
    watcher.start()
    clients.run(until)
    faults.join()
    injector.settle()
    for fault in injector.faults:
        fault.recovery_s = recovery(fault, clients.sessions)
    return Outcome(clients.sessions, injector.faults, references, injector.errors)


def _progress(clients: Clients, injector: Injector, until: float, progress) -> None:
    while time.monotonic() < until:
        time.sleep(15)
        done = [s for s in clients.sessions if s.ended]
        progress(f"{len(done)} sessions done ({sum(bool(s.error) for s in done)} failed), "
                 f"{len(injector.faults)} faults: "
                 f"{', '.join(f'{f.kind}@{f.victim}' for f in injector.faults[-3:])}")


class ChaosSettings(BaseModel):
    """Chaos under load: concurrent streaming clients against a local cluster of real processes
    while a random fault hits every few seconds; every session must complete with the no-fault
    text and its rounds 1..n."""

    pair: PairName = Field("tiny", description="Built-in model pair: tiny "
                                             "(random weights) or smollm2.")
    minutes: float = Field(ChaosConfig.duration_s / 60, gt=0, description="How long clients "
                           "start new sessions.")
    streams: int = Field(ChaosConfig.streams, ge=1, description="Concurrent streaming clients.")
    fault_every_s: float = Field(ChaosConfig.fault_every_s, gt=0, description="Mean seconds "
                                 "between faults.")
    seed: int = Field(ChaosConfig.seed, description="Seed of the faults' and the clients' draws.")
    kinds: list[Kind] = Field(list(ChaosConfig.kinds), min_length=1, description="Fault kinds "
                              "to draw from (repeat the flag; default: all of them).")
    out: Path | None = Field(None, description="Write the table into this markdown file.")
    section: str = Field("chaos", description="The file's section to write (<!-- NAME --> ... "
                         "<!-- /NAME -->).")
    workdir: Path = Field(Path("runs/chaos"), description="Where the cluster's logs go.")


def run(settings: ChaosSettings) -> None:
    """Run the chaos, print every failed session and the table, write it if asked; exit 1
    unless every session passed."""
    from cascade.bench.output import write_section
    from cascade.bench.compare.run import machine

    s, kinds = settings, tuple(settings.kinds)
    config = ChaosConfig(streams=s.streams, duration_s=s.minutes * 60,
                         fault_every_s=s.fault_every_s, seed=s.seed, kinds=kinds)
    target, drafter = default_pair(None, None, s.pair)
    chaos = ChaosCluster(target, drafter, s.workdir).start()
    try:
        outcome = run_chaos(chaos, config)
    finally:
        chaos.stop()
    _print_failures(outcome)
    result = (f"Machine: {machine()}; pair: {s.pair}; {s.streams} streams for "
              f"{s.minutes:g} min, a fault every ~{s.fault_every_s:g} s "
              f"({', '.join(kinds)}).\n\n" + table(outcome))
    print(result)
    if s.out:
        write_section(s.out, f"<!-- {s.section} -->", result)
    raise SystemExit(0 if outcome.ok() else 1)


def _print_failures(outcome: Outcome) -> None:
    for session in outcome.sessions:
        if session.error or session.tokens != outcome.references[session.prompt]:
            during = [f"{f.kind}@{f.victim}" for f in outcome.faults
                      if session.started - 1 <= f.at <= (session.ended or f.at)]
            print(f"FAILED prompt {session.prompt} (faults during it: {during}; "
                  f"{len(session.resumes)} resumes): {session.error or 'text differs'}")
    for error in outcome.errors:
        print(f"SUITE: {error}")


if __name__ == "__main__":
    settings_command(ChaosSettings, run)()

"""Fault injection on a local cluster of real processes (two verifiers, two drafters, two
gateways and Redis with its append-only file): during a streaming generation, kill -9 the
drafter, the verifier or the gateway serving it, or kill -9 Redis and start it again, after a
random round. The client (``cascade.tools.client``, which resumes a broken stream on the other
gateway) reads on; every trial must complete with exactly the tokens of the same request without
a fault (greedy, and seeded sampling), no round twice and none missing. Requests draft a fixed
k per round: a seeded sampled text depends on where blocks end, and the planner's lengths follow
timing, which a fault changes. The killed process is
started again before the next trial.

    cascade bench faults --pair tiny --trials 30 --out docs/reliability.md
"""

from __future__ import annotations

import os
import random
import signal
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from pydantic import BaseModel, Field

from cascade.serving.settings_cli import settings_command
from cascade.tools.client import stream_generation
from cascade.tools.local_cluster import LocalCluster
from cascade.tools.pairs import PairName, default_pair
from cascade.tools.cluster_config import ClusterConfig
from gateway.sessions.session_store import session_keys

ROLES = ("drafter", "verifier", "gateway", "redis")
LEASE_S = 2.0
"""Session lease of the cluster's gateways: a stream whose gateway died resumes after it."""
REDIS_DOWN_S = 0.5
"""How long Redis stays dead before it starts again (its clients retry for about 3 s)."""


@dataclass
class Trial:
    role: str
    sampled: bool
    kill_after: int
    """Rounds the client had received when the fault hit."""
    tokens: list[int] = field(default_factory=list)
    identical: bool = False
    recovery_s: float | None = None
    """From the fault to the next round the client received."""
    error: str = ""

    @property
    def completed(self) -> bool:
        return not self.error


def fault_cluster(target: Path, drafter: Path, workdir: Path) -> LocalCluster:
    """Two verifiers, two drafters, two gateways (short session leases), Redis with AOF."""
    config = ClusterConfig(target, drafter, num_drafters=2, num_verifiers=2,
                           http_port=0, grpc_port=0, workdir=workdir,
                           gateway_args=("--session-lease-s", str(LEASE_S)))
    cluster = LocalCluster(config).start()
    try:
        cluster.add_gateway()
    except BaseException:
        cluster.stop()
        raise
    return cluster


class FaultRunner:
    def __init__(self, cluster: LocalCluster, prompt: str = "def fibonacci(n):",
                 max_tokens: int = 48, k: int = 3, seed: int = 7) -> None:
        self.cluster, self.prompt, self.max_tokens, self.k, self.seed = (
            cluster, prompt, max_tokens, k, seed)
        self.gateways = [cluster.grpc_address, *[cluster.grpc_address_of(name)
                                                 for name in cluster.processes
                                                 if name.startswith("gateway-")]]
        self.references: dict[bool, list[int]] = {}
        self.redis = cluster.redis.sync_client()

    def generate(self, sampled: bool, on_response=None) -> list[int]:
        """One streaming generation, resumed on the other gateway if its own dies; the
        model's blocks of k (a memory run of a repetitive output could end the stream before
        the round a fault is timed for)."""
        return stream_generation(self.gateways, self.prompt, self.max_tokens, self.k,
                                 temperature=0.8 if sampled else 0.0, seed=self.seed,
                                 chat=False, on_response=on_response, timeout_s=300,
                                 schedule="fixed", draft_method="model").token_ids

    def reference(self, sampled: bool) -> list[int]:
        if sampled not in self.references:
            self.references[sampled] = self.generate(sampled)
        return self.references[sampled]

    def trial(self, role: str, sampled: bool, rng: random.Random) -> Trial:
        expected = self.reference(sampled)
        trial = Trial(role, sampled, kill_after=rng.randint(1, 4))
        seen, fault = [], {}

        def on_response(response) -> None:
            seen.append(response.round)
            if fault and trial.recovery_s is None:
                trial.recovery_s = time.monotonic() - fault["at"]
            if len(seen) == trial.kill_after:
                fault.update(victim=self._inject(role, response.session_id),
                             at=time.monotonic())

        try:
            trial.tokens = self.generate(sampled, on_response)
        except grpc.RpcError as exc:
            trial.error = f"{exc.code().name}: {exc.details()}"
        finally:
            if fault:
                self._heal(fault["victim"])
        if seen != list(range(1, len(seen) + 1)):
            trial.error = trial.error or f"rounds out of order: {seen}"
        trial.identical = trial.tokens == expected
        return trial

    def _inject(self, role: str, session_id: str) -> str:
        """Kill the role's process serving ``session_id`` (Redis: kill it, start it again
        in the background); returns what to heal."""
        if role == "redis":
            threading.Thread(target=self._restart_redis, daemon=True).start()
            return "redis"
        if role == "gateway":  # the client's first gateway: the one streaming to it
            os.kill(self.cluster.processes["gateway"].pid, signal.SIGKILL)
            return "gateway"
        address = self.redis.hget(session_keys(session_id)[0], role).decode()
        name = self.cluster.name_of(address)
        self.cluster.processes[name].kill()
        return name

    def _restart_redis(self) -> None:
        server = self.cluster.redis
        server.process.kill()
        server.process.wait()
        time.sleep(REDIS_DOWN_S)
        server.start()

    def _heal(self, victim: str) -> None:
        if victim == "redis":
            while self.cluster.redis.process.poll() is not None:
                time.sleep(0.1)
            return
        self.cluster.processes[victim].wait()
        self.cluster.restart(victim)

    def close(self) -> None:
        self.redis.close()


def run_trials(runner: FaultRunner, roles: tuple[str, ...], trials: int, seed: int = 0,
               progress=lambda trial: None) -> list[Trial]:
    rng = random.Random(seed)
    done = []
    for i in range(trials):
        for role in roles:
            trial = runner.trial(role, sampled=i % 2 == 1, rng=rng)
            progress(trial)
            done.append(trial)
    return done


def table(trials: list[Trial]) -> str:
    """role, trials, completed, identical, mean and max recovery (markdown)."""
    lines = ["| fault | trials | completed | identical to the no-fault run | recovery mean s | "
             "recovery max s |", "|---|---|---|---|---|---|"]
    for role in dict.fromkeys(t.role for t in trials):
        mine = [t for t in trials if t.role == role]
        times = [t.recovery_s for t in mine if t.recovery_s is not None]
        mean = f"{statistics.mean(times):.2f}" if times else "–"
        worst = f"{max(times):.2f}" if times else "–"
        lines.append(f"| kill -9 {role} | {len(mine)} | {sum(t.completed for t in mine)} | "
                     f"{sum(t.identical for t in mine)} | {mean} | {worst} |")
    return "\n".join(lines) + "\n"


class FaultsSettings(BaseModel):
    """Kill -9 the drafter, verifier, gateway or Redis serving a streaming generation, on a
    local cluster of real processes; every trial must complete with the no-fault tokens."""

    pair: PairName = Field("tiny", description="Built-in model pair: tiny "
                                             "(random weights) or smollm2.")
    trials: int = Field(30, ge=1, description="Trials per fault (alternately greedy and "
                        "seeded sampling).")
    out: Path | None = Field(None, description="Write the table into this markdown file.")
    workdir: Path = Field(Path("runs/faults"), description="Where the cluster's logs go.")


def run(settings: FaultsSettings) -> None:
    """Run every fault ``trials`` times, print each trial and the table, and write it if
    asked."""
    from cascade.bench.output import write_section
    from cascade.bench.compare.run import machine

    target, drafter = default_pair(None, None, settings.pair)
    cluster = fault_cluster(target, drafter, settings.workdir)
    runner = FaultRunner(cluster)
    try:
        trials = run_trials(runner, ROLES, settings.trials, progress=_print_trial)
    finally:
        runner.close()
        cluster.stop()
    result = f"Machine: {machine()}; pair: {settings.pair}.\n\n" + table(trials)
    print(result)
    if settings.out:
        write_section(settings.out, "<!-- faults -->", result)


def _print_trial(t: Trial) -> None:
    print(f"{t.role:<8} {'sampled' if t.sampled else 'greedy ':<7} after round "
          f"{t.kill_after}: {'ok' if t.completed and t.identical else 'FAILED ' + t.error}"
          f", recovery {t.recovery_s}")


if __name__ == "__main__":
    settings_command(FaultsSettings, run)()

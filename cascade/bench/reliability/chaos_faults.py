"""The chaos run's fault injector (``cascade.bench.reliability.chaos``): every
~``fault_every_s`` one fault on a process no other fault is touching: kill -9 (started again
after ``restart_after_s``), a SIGSTOP for ``hang_s``, or a dropped or stalled link through the
fault proxies."""

from __future__ import annotations

import random
import signal
import threading
import time
from typing import TYPE_CHECKING

from cascade.bench.reliability.chaos_report import Fault

if TYPE_CHECKING:
    from cascade.bench.reliability.chaos import ChaosCluster, ChaosConfig


class Injector:
    """Every ~``fault_every_s`` one fault on a process no other fault is touching."""

    def __init__(self, chaos: ChaosCluster, config: ChaosConfig) -> None:
        self.chaos, self.config = chaos, config
        self.rng = random.Random(config.seed)
        self.faults: list[Fault] = []
        self.busy: set[str] = set()
        self.lock = threading.Lock()
        self.heals: list[threading.Thread] = []
        self.errors: list[str] = []
        """What went wrong in the suite itself (a restart that failed)."""

    def run(self, until: float) -> None:
        i = 0
        while True:
            gap = self.config.fault_every_s * self.rng.uniform(0.7, 1.3)
            if time.monotonic() + gap > until:
                return
            time.sleep(gap)
            kinds = self.config.kinds
            kind = kinds[i % len(kinds)] if self.config.in_order else self.rng.choice(kinds)
            if self.inject(kind) is not None:  # in order: a kind whose victims are busy waits
                i += 1

    def inject(self, kind: str) -> Fault | None:
        action, what = kind.split("-", 1)
        role = {"drafter-verifier": "drafter", "gateway-redis": "gateway",
                "redis-primary": "redis"}.get(what, what)
        with self.lock:
            free = [n for n in self.chaos.names(role) if n not in self.busy]
            if role != "redis" and not free or role == "redis" and "redis" in self.busy:
                return None
            victim = "redis" if role == "redis" else self.rng.choice(free)
            self.busy.add(victim)
        fault = Fault(kind, victim, time.monotonic())
        self.faults.append(fault)
        heal = getattr(self, f"_{action}")(victim, what)
        thread = threading.Thread(target=self._heal, args=(victim, heal), daemon=True)
        thread.start()
        self.heals.append(thread)
        return fault

    def _heal(self, victim: str, heal) -> None:
        try:
            heal()
        except Exception as exc:  # noqa: BLE001 - reported; the run goes on without it
            self.errors.append(f"healing {victim} failed: {exc}")
        finally:
            with self.lock:
                self.busy.discard(victim)

    def _kill(self, victim: str, what: str):
        cluster = self.chaos.cluster
        if victim == "redis":
            old = cluster.redis.primary_port()
            server = cluster.redis.server_on(old)
            server.process.kill()

            def heal() -> None:
                cluster.redis.wait_for_failover(old)
                time.sleep(self.config.restart_after_s)
                cluster.redis.restart(server)  # as a replica of the new primary
            return heal
        cluster.processes[victim].kill()

        def heal() -> None:
            cluster.processes[victim].wait()
            time.sleep(self.config.restart_after_s)
            cluster.restart(victim)
        return heal

    def _hang(self, victim: str, what: str):
        process = self.chaos.cluster.processes[victim]
        process.send_signal(signal.SIGSTOP)

        def heal() -> None:
            time.sleep(self.config.hang_s)
            process.send_signal(signal.SIGCONT)
        return heal

    def _link(self, victim: str, what: str, fault: str, seconds: float):
        pid = self.chaos.cluster.processes[victim].pid
        side = "verifier" if what == "drafter-verifier" else "redis-"
        for name, proxy in self.chaos.proxies.items():
            if name.startswith(side):
                getattr(proxy, fault)(seconds, pid=pid)
        return lambda: time.sleep(seconds)

    def _drop(self, victim: str, what: str):
        return self._link(victim, what, "drop", self.config.drop_s)

    def _stall(self, victim: str, what: str):
        return self._link(victim, what, "stall", self.config.stall_s)

    def settle(self) -> None:
        for thread in self.heals:
            thread.join()

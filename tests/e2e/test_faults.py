"""Fault injection with real processes (two verifiers, two drafters, two gateways, Redis with
its append-only file): kill -9 the drafter, verifier or gateway serving a streaming generation,
or Redis, mid-stream; the session completes with exactly the no-fault tokens (greedy and seeded
sampling), the client resuming on the other gateway when its own died. Two trials per fault in
CI (one greedy, one sampled); thirty in the slow version (its table is in docs/reliability.md,
made by ``cascade bench faults``)."""

from __future__ import annotations

import pytest

from cascade.bench.reliability.faults import ROLES, FaultRunner, fault_cluster, run_trials, table


@pytest.fixture
def fault_runner(tiny_pair_dirs, tmp_path):
    cluster = fault_cluster(*tiny_pair_dirs, tmp_path)
    runner = FaultRunner(cluster)
    yield runner
    runner.close()
    cluster.stop()


def check(trials) -> None:
    print(table(trials))
    failed = [t for t in trials if not (t.completed and t.identical)]
    assert not failed, [(t.role, t.sampled, t.kill_after, t.error) for t in failed]
    assert all(t.recovery_s is not None for t in trials)  # every fault hit a live stream


def test_a_greedy_and_a_sampled_fault_of_each_kind(fault_runner):
    check(run_trials(fault_runner, ROLES, trials=2, seed=1))


@pytest.mark.slow
def test_thirty_faults_of_each_kind(fault_runner):
    check(run_trials(fault_runner, ROLES, trials=30, seed=2))

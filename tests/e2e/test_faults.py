"""Fault injection with real processes (two verifiers, two drafters, a gateway, Redis with its
append-only file): kill -9 the drafter or verifier serving a streaming generation, or Redis,
mid-stream; the session completes with exactly the no-fault tokens (greedy and seeded
sampling). Three trials per fault in CI; thirty in the slow version (its table is in
docs/reliability.md, made by ``python -m cascade.bench.faults``)."""

from __future__ import annotations

import pytest

from cascade.bench.faults import ROLES, FaultRunner, run_trials, table
from cascade.tools.local_cluster import ClusterConfig, LocalCluster
from cascade.tools.redis_server import free_port


@pytest.fixture
def fault_runner(tiny_pair_dirs, tmp_path):
    target, drafter = tiny_pair_dirs
    config = ClusterConfig(target, drafter, num_drafters=2, num_verifiers=2,
                           http_port=free_port(), grpc_port=free_port(), workdir=tmp_path)
    cluster = LocalCluster(config).start()
    runner = FaultRunner(cluster)
    yield runner
    runner.close()
    cluster.stop()


def check(trials) -> None:
    print(table(trials))
    failed = [t for t in trials if not (t.completed and t.identical)]
    assert not failed, [(t.role, t.sampled, t.kill_after, t.error) for t in failed]
    assert all(t.recovery_s is not None for t in trials)  # every fault hit a live stream


def test_three_faults_of_each_kind(fault_runner):
    check(run_trials(fault_runner, ROLES, trials=3, seed=1))


@pytest.mark.slow
def test_thirty_faults_of_each_kind(fault_runner):
    check(run_trials(fault_runner, ROLES, trials=30, seed=2))

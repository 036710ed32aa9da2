"""The chaos suite's short version (cascade bench chaos runs the long one): streaming
clients against 2 gateways, 2 verifiers, 3 drafters and Redis with 2 replicas and 3 sentinels,
while every kind of fault hits once, in turn: kill -9 of each role and of the Redis primary, a
hung (SIGSTOPped) pod of each role, dropped and stalled drafter-verifier and gateway-Redis
links. Every session must complete with the no-fault run's greedy text and its rounds 1..n."""

from cascade.bench.reliability.chaos import KINDS, ChaosCluster, ChaosConfig, run_chaos, table

CONFIG = ChaosConfig(streams=6, duration_s=50.0, fault_every_s=3.5, hang_s=4.0, stall_s=3.0,
                     drop_s=1.0, max_tokens=32, idle_timeout_s=6.0, in_order=True)


def test_every_fault_kind_under_load_loses_nothing(tiny_pair_dirs, tmp_path):
    target, drafter = tiny_pair_dirs
    chaos = ChaosCluster(target, drafter, tmp_path).start()
    try:
        outcome = run_chaos(chaos, CONFIG, progress=lambda line: None)
    finally:
        chaos.stop()
    report = table(outcome) + "\n".join(outcome.errors)
    assert {f.kind for f in outcome.faults} == set(KINDS), report
    summary = outcome.summary()
    assert summary["sessions"] >= 30, report
    assert outcome.ok(), report

"""The speculation-memory benchmarks on the tiny pair (no speed assertions): the lookup benchmark
finds the sequences it indexed, and the workload benchmark runs its modes through real
processes, the memory mode drafting from generations of the first pass in the second."""

from cascade.bench import memory, suffix_lookup
from cascade.tools.tiny_models import build_tiny_pair


def test_lookups_find_what_was_indexed():
    index, sequences, seconds = suffix_lookup.build(2_000)
    result = suffix_lookup.measure(index, sequences, 200)
    assert index.num_sequences == 2_000 and seconds > 0
    assert result["hit_rate"] > 0.9
    assert 0 < result["lookup_p50_ms"] <= result["lookup_p99_ms"]


def test_workloads_run_through_the_gateway_and_the_memory_drafts_the_rerun(tmp_path):
    target, drafter = build_tiny_pair(tmp_path / "models")
    results = memory.run(target, drafter, tmp_path / "runs", ["target", "suffix"], max_tokens=6,
                         workloads=("tool-calls",))
    target_only, suffix = (results["modes"][m]["tool-calls"] for m in ("target", "suffix"))
    assert target_only["tokens"] == suffix["tokens"] > 0  # greedy: the same text
    assert target_only.get("drafted:memory", 0) == 0
    assert suffix["accepted:memory"] > 0
    assert "memory: suffix" in str(memory.table(results).columns[0]._cells)


def test_the_prediction_table_reports_what_the_usage_counts_say():
    results = {"modes": {
        "default": {"files": {"tokens": 90, "tokens_per_s": 20.0}},
        "predict": {"files": {"tokens": 90, "tokens_per_s": 25.0,
                              "accepted_prediction_tokens": 40,
                              "rejected_prediction_tokens": 12,
                              "accepted:prediction": 30, "drafted:prediction": 64}}}}
    table = memory.prediction_table(results)
    rows = [[str(c) for c in column._cells] for column in table.columns]
    assert rows[0] == [memory.MODES["predict"].name]  # the mode without a prediction is left out
    assert [r[0] for r in rows[1:]] == ["files", "90", "40", "12", "30/64"]
    assert "files" in memory.WORKLOADS and len(memory.FILES) == 5

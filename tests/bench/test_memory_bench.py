"""The speculation-memory benchmarks on the tiny pair (no speed assertions): the lookup benchmark
finds the sequences it indexed, and the workload benchmark runs its modes through real
processes, the memory mode drafting from generations of the first pass in the second."""

from cascade.bench.drafting import memory, suffix_lookup
from cascade.bench.drafting.prediction_ceiling import perfect_rounds
from cascade.tools.tiny_models import build_tiny_pair


def test_lookups_find_what_was_indexed():
    index, sequences, seconds = suffix_lookup.build(2_000)
    result = suffix_lookup.measure(index, sequences, 200)
    assert index.num_sequences == 2_000 and seconds > 0
    assert result["hit_rate"] > 0.9
    assert 0 < result["lookup_p50_ms"] <= result["lookup_p99_ms"]


def test_workloads_run_through_the_gateway_and_the_memory_drafts_the_rerun(tmp_path):
    target, drafter = build_tiny_pair(tmp_path / "models")
    results = memory.measure(target, drafter, tmp_path / "runs", ["target", "suffix"],
                             max_tokens=6, workloads=("tool-calls",))
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
    assert [r[0] for r in rows[1:]] == ["files", "90", "40", "12", "30/64", "-", "-"]
    assert "files" in memory.WORKLOADS and len(memory.FILES) == 5


def test_a_perfect_prediction_drafter_drafts_every_matching_run_and_nothing_else():
    prediction = list(range(100, 170))
    assert perfect_rounds(prediction, prediction) == 3  # 32 drafted + 1 own, twice, then 4
    assert perfect_rounds(prediction, [1, 2, 3]) == 3  # nothing matches: decoded alone
    edited = prediction[:10] + [7, 8] + prediction[12:20]  # two tokens changed
    # 10 drafted + the verifier's 7, then 8 alone, then the last 8 drafted at once
    assert perfect_rounds(prediction, edited) == 3
    assert perfect_rounds(prediction, edited, block=4) == 6  # 5, 5, 1, 1, 5, 4 tokens
    assert perfect_rounds(prediction, []) == 0


def test_edits_with_predictions_report_usage_and_a_perfect_drafters_rounds(tmp_path):
    target, drafter = build_tiny_pair(tmp_path / "models")
    results = memory.measure(target, drafter, tmp_path / "runs", ["predict"], max_tokens=4,
                             workloads=("files",))
    files = results["modes"]["predict"]["files"]
    assert files["tokens"] > 0 and files["rounds"] >= 5  # five requests, a round at least each
    found = files.get("accepted_prediction_tokens", 0)  # the tiny target edits nothing well
    assert 0 <= found <= files["tokens"] and files["rejected_prediction_tokens"] > 0
    assert 5 <= files["perfect_rounds"] <= files["tokens"]

"""The whole benchmark on the tiny pair in seconds (no speed assertions): every method runs,
greedy outputs agree across methods, and the files are written."""

import json
from pathlib import Path

import pytest

from cascade.bench.compare.inprocess import K_CANDIDATES
from cascade.bench.compare.output import save
from cascade.bench.compare.report import goals
from cascade.bench.compare.run import BenchConfig, measure
from cascade.tools.tiny_models import build_tiny_pair


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    return build_tiny_pair(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def bench_run(tiny_pair, tmp_path_factory):
    from rich.console import Console

    target, drafter = tiny_pair
    out = tmp_path_factory.mktemp("bench")
    config = BenchConfig(target=target, drafter=drafter, out=out, k=3, max_new_tokens=6,
                         per_domain=1, repeats=1, threads=1)
    rows, context = measure(config, Console(quiet=True))
    return rows, context, out


def test_every_method_runs_on_every_domain(bench_run):
    rows, context, _ = bench_run
    assert {(r.family, r.mode) for r in rows} == {
        (f, m) for f in ("core", "hf", "services") for m in ("greedy", "T=0.7")}
    assert len(rows) == 11
    for row in rows:
        assert set(row.per_domain_tokens_per_s) == {"prose", "chat", "code"}
        assert row.summary.tokens == 3 * 6 or row.mode != "greedy"
        assert row.summary.tokens_per_s > 0 and row.summary.ttft_ms > 0
    assert context["prompts"] == 3


def test_greedy_output_is_identical_across_methods(bench_run):
    rows, _, _ = bench_run
    greedy = [r for r in rows if r.mode == "greedy"]
    assert len(greedy) == 7 and all(r.same_output for r in greedy)


def test_speculative_rows_have_acceptance_and_an_ideal(bench_run):
    rows, _, _ = bench_run
    for row in rows:
        if "k=0" in row.method or "no assistant" in row.method:
            assert row.ideal is None and row.speedup == pytest.approx(1.0)
            continue
        assert 0 <= row.summary.acceptance <= 1 and row.summary.mean_acceptance_length >= 1
        assert row.ideal > 0 and row.cost_ratio > 0
    services = [r for r in rows if r.family == "services" and r.ideal]
    assert all(r.summary.overhead_ms is not None for r in services)
    assert len(goals(rows)) == 5
    for row in rows:  # the verify cost v is timed by the core loop and the verifier only
        if row.ideal is not None:
            assert (row.verify_cost is None) == (row.family == "hf")
            assert row.verify_cost is None or row.verify_cost > 0


def test_results_table_and_plots_are_written(bench_run):
    rows, context, out = bench_run
    paths = save(rows, context, out)
    results = json.loads((out / "results.json").read_text())
    assert len(results["rows"]) == len(rows)
    assert "| Cascade services (k=3) | greedy |" in (out / "table.md").read_text()
    for png in [p for p in paths if p.suffix == ".png"]:
        assert png.read_bytes()[:4] == b"\x89PNG"


def test_one_family_runs_alone(tiny_pair, tmp_path):
    from rich.console import Console

    target, drafter = tiny_pair
    config = BenchConfig(target=target, drafter=drafter, out=tmp_path / "bench", k=0,
                         max_new_tokens=4, per_domain=1, repeats=1, threads=1,
                         families=("core",))
    rows, context = measure(config, Console(quiet=True))
    assert {r.family for r in rows} == {"core"} and len(rows) == 3
    assert context["k"] in K_CANDIDATES  # k = 0: the fastest candidate was picked
    assert rows[1].method == f"Cascade core (k={context['k']})" and "fastest" in rows[1].note
    assert all(r.same_output for r in rows if r.mode == "greedy")
    assert goals(rows) == [] and context["pinning"] == "–"


def test_unknown_family_is_refused():
    with pytest.raises(ValueError, match="families must be"):
        BenchConfig(target=Path("t"), drafter=Path("d"), families=("gpu",))

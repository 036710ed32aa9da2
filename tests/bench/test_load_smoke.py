"""The load benchmark on the tiny pair in seconds (no speed assertions): batched, target-only
and auto modes run against real processes, every point streams tokens without errors, and the
table and the plot are written (the tree mode is the same code path with another draft shape;
trees under load are tested end to end in tests/e2e/test_trees_e2e.py)."""

import json
import os

from cascade.bench.load.sweep import LoadConfig, run_load
from cascade.bench.load.report import save
from cascade.tools.tiny_models import build_tiny_pair


def test_load_points_stream_tokens_and_are_saved(tmp_path):
    target, drafter = build_tiny_pair(tmp_path / "models")
    config = LoadConfig(target, drafter, tmp_path / "out", k=3, sessions=(1, 3), max_tokens=8,
                        window_s=1.0, soak_s=1.0, only=("batched", "target-only", "auto"))
    cores = os.sched_getaffinity(0)
    result = run_load(config)
    assert os.sched_getaffinity(0) == cores  # the client's pinning is undone
    points = result["points"]
    assert [(p["mode"], p["sessions"], p["soak"]) for p in points] == [
        ("speculative k=3, batched", 1, False), ("speculative k=3, batched", 3, False),
        ("speculative k=3, batched", 3, True), ("target-only, batched", 1, False),
        ("target-only, batched", 3, False), ("auto (k <= 3)", 1, False),
        ("auto (k <= 3)", 3, False)]
    assert all(p["tokens_per_s"] > 0 and p["errors"] == 0 for p in points), points
    paths = save(result, tmp_path / "out")
    saved = json.loads(paths[0].read_text())
    assert saved["points"] == points
    assert (saved["config"]["target"], saved["config"]["out"]) == (target.name, "out")
    assert str(tmp_path) not in paths[0].read_text()  # where this machine keeps them: not kept
    assert "| target-only, batched | 3 |" in paths[1].read_text()
    assert "| sessions | target-only | best fixed k | auto | auto / best |" in paths[1].read_text()
    assert paths[2].stat().st_size > 10_000

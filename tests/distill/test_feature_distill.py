"""Feature-drafter distillation on a tiny target built in the test: a few steps, checkpoint,
resume, export, load beside the target, draft exactly; the evaluator measures it."""

import json
from pathlib import Path

import pytest

from cascade.core.features.feature_runner import FeatureRunner, load_model
from cascade.core.loop import generate
from cascade.core.model.runner import ModelRunner, ModelSpec
from cascade.distill.measure.evaluate import evaluate_pair
from cascade.distill.features.run import FeatureDistillConfig, run_feature_distillation
from cascade.protocol.settings import DraftConfig, SamplingParams
from models import tiny_gpt2_folder


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory) -> Path:
    return tiny_gpt2_folder(tmp_path_factory.mktemp("target"), num_layers=2)


def small(target: Path, out: Path, minutes: float) -> FeatureDistillConfig:
    return FeatureDistillConfig(target=target, out=out, minutes=minutes, vocab_size=120,
                                batch_size=4, gen_batch=4, max_new_tokens=12, steps_per_chunk=2,
                                eval_sequences=2, eval_every_s=0.0, prose_per_batch=2,
                                prose_packages=())  # the Python documentation only: fast


def test_feature_distillation_resumes_exports_and_drafts_exactly(tiny_target, tmp_path):
    out = tmp_path / "feature"
    run_feature_distillation(small(tiny_target, out, minutes=0.02))
    first = json.loads((out / "distill_history.json").read_text())["history"]
    more = (first[-1]["elapsed_s"] + 0.5) / 60  # a budget the first run did not spend
    run_feature_distillation(small(tiny_target, out, minutes=more))
    history = json.loads((out / "distill_history.json").read_text())["history"]
    assert len(history) > len(first) and history[: len(first)] == first  # resumed
    assert all("held_out_acceptance_k4" in r for r in history)  # measured at every export
    drafter = load_model(ModelSpec(str(out)), str(tiny_target))
    assert isinstance(drafter, FeatureRunner)
    target = ModelRunner.load(ModelSpec(str(tiny_target)))
    prompt = target.tokenizer("def main():").input_ids
    params = SamplingParams(max_new_tokens=10)
    result = generate(target, prompt, params, drafter, DraftConfig(3))
    assert result.tokens == generate(target, prompt, params).tokens
    assert result.stats.num_draft_tokens > 0
    report = evaluate_pair(target, drafter, num_prompts=2, max_new_tokens=8, k=3)
    assert 0.0 <= report.acceptance <= 1.0 and report.drafter_ms > 0
    assert report.mean_accepted_length >= 1.0 and report.ideal_speedup > 0
    assert 0 < report.mean_draft_length <= 3
    with pytest.raises(ValueError, match="needs a model drafter"):
        evaluate_pair(target, drafter, num_prompts=1, max_new_tokens=4, k=3, adaptive=True)


def test_a_feature_drafter_without_its_target_is_refused(tiny_target, tmp_path):
    out = tmp_path / "feature"
    run_feature_distillation(small(tiny_target, out, minutes=0.01))
    with pytest.raises(ValueError, match="--target-model"):
        load_model(ModelSpec(str(out)))


def test_a_resumed_run_gets_its_replay_pool_back(tiny_target, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cascade.distill.features.run import FeatureDistiller, load_checkpoint
    from cascade.distill.run import CHECKPOINT

    config = small(tiny_target, tmp_path / "feature", minutes=0.02)
    run_feature_distillation(config)
    saved = torch.load(config.out / "work" / CHECKPOINT, weights_only=False)["pool"]
    assert saved and any(start > 0 for _, start in saved)  # answers (real text starts at 0)
    teacher = AutoModelForCausalLM.from_pretrained(tiny_target).eval()
    resumed = FeatureDistiller(config, teacher, AutoTokenizer.from_pretrained(tiny_target))
    assert load_checkpoint(resumed, config.out / "work")
    assert [s.tokens.tolist() for s in resumed.pool] == [t.tolist() for t, _ in saved]
    assert [s.answer_start for s in resumed.pool] == [start for _, start in saved]
    width = len(resumed.layers) * teacher.config.hidden_size
    assert all(s.features.shape == (len(s.tokens), width) for s in resumed.pool)
    from_export = FeatureDistiller(config, teacher, AutoTokenizer.from_pretrained(tiny_target))
    from_export.start_from(config.out)  # --init: the export carries the pool's token rows
    assert [s.tokens.tolist() for s in from_export.pool] == [t.tolist() for t, _ in saved]
    assert [s.answer_start for s in from_export.pool] == [start for _, start in saved]


def test_an_export_keeps_only_the_newest_pool_rows():
    from types import SimpleNamespace

    import torch

    from cascade.distill.features.pool import newest

    pool = [SimpleNamespace(tokens=torch.zeros(n)) for n in (50, 30, 20, 40)]

    def lengths(rows):
        return [len(row.tokens) for row in rows]

    assert lengths(newest(pool, 60)) == [20, 40]
    assert lengths(newest(pool, 89)) == [20, 40]
    assert lengths(newest(pool, 90)) == [30, 20, 40]
    assert lengths(newest(pool, 1000)) == [50, 30, 20, 40]
    assert newest(pool, 10) == []

"""Distillation with a tiny target built in the test: it trains, checkpoints, resumes, exports."""

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from cascade.distill.run import run_distillation
from cascade.distill.student import StudentShape, choose_vocabulary
from cascade.distill.train import DistillConfig, Distiller, distill_loss
from cascade.protocol.settings import DraftConfig
from cascade.core.loop import generate
from cascade.core.model.runner import ModelRunner, ModelSpec
from cascade.protocol.settings import SamplingParams
from models import tiny_gpt2_folder

SHAPE = StudentShape(vocab_size=120, hidden_size=32, num_layers=1, intermediate_size=64,
                     num_heads=2, num_kv_heads=1)


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory) -> Path:
    return tiny_gpt2_folder(tmp_path_factory.mktemp("target"), num_layers=1)


def small_config(target: Path, out: Path, minutes: float) -> DistillConfig:
    return DistillConfig(target=target, out=out, minutes=minutes, batch_prompts=4,
                         max_new_tokens=12, warmup_chunks=1, steps_per_chunk=2, batch_size=4,
                         checkpoint_every_s=0.0, shape=SHAPE)


def test_choose_vocabulary_keeps_special_and_frequent_tokens():
    counts = Counter({5: 10, 9: 7, 2: 3, 11: 1})
    assert choose_vocabulary(counts, special_ids=[0], size=3) == [0, 5, 9]


def test_run_resumes_and_exports_a_drafter_the_loop_can_use(tiny_target, tmp_path):
    out = tmp_path / "drafter"
    run_distillation(small_config(tiny_target, out, minutes=0.02))
    first = json.loads((out / "distill_history.json").read_text())["history"]
    run_distillation(small_config(tiny_target, out, minutes=0.04))
    history = json.loads((out / "distill_history.json").read_text())["history"]
    assert len(history) > len(first) and history[: len(first)] == first  # resumed, not restarted
    assert any(r["agreement"] is not None for r in history)
    drafter = ModelRunner.load(ModelSpec(str(out)))
    target = ModelRunner.load(ModelSpec(str(tiny_target)))
    assert drafter.vocab_size == target.vocab_size
    prompt = target.tokenizer("def main():").input_ids
    params = SamplingParams(max_new_tokens=10)
    result = generate(target, prompt, params, drafter, DraftConfig(3))
    assert result.tokens == generate(target, prompt, params).tokens  # exact whatever the drafter


def test_training_lowers_the_distillation_loss(tiny_target, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = small_config(tiny_target, tmp_path, minutes=1)
    teacher = AutoModelForCausalLM.from_pretrained(tiny_target).eval()
    distiller = Distiller(config, teacher, AutoTokenizer.from_pretrained(tiny_target))
    chunk = distiller.teacher_chunk()
    distiller.buffer.append(chunk)
    distiller.start_student()
    with torch.no_grad():
        before = float(distill_loss(distiller.model, distiller.vocab, chunk, 0.5))
    for _ in range(20):
        distiller.train_steps(chunk, fraction=0.5)
    with torch.no_grad():
        after = float(distill_loss(distiller.model, distiller.vocab, chunk, 0.5))
    assert after < before - 0.5, (before, after)  # the floor is the teacher's own entropy


def test_init_continues_from_an_exported_drafter(tiny_target, tmp_path):
    first = tmp_path / "first"
    run_distillation(small_config(tiny_target, first, minutes=0.02))
    again = tmp_path / "again"
    config = small_config(tiny_target, again, minutes=0.0)
    run_distillation(DistillConfig(**{**vars(config), "init": first}))  # no training: export
    before = ModelRunner.load(ModelSpec(str(first)))
    after = ModelRunner.load(ModelSpec(str(again)))
    assert after.vocab_map.to_target.tolist() == before.vocab_map.to_target.tolist()
    for (name, a), (_, b) in zip(before.model.state_dict().items(),
                                 after.model.state_dict().items()):
        torch.testing.assert_close(a, b, msg=name)


def test_init_rejects_a_folder_that_is_not_a_distilled_drafter(tiny_target, tmp_path):
    config = small_config(tiny_target, tmp_path / "out", minutes=0.0)
    with pytest.raises(ValueError, match="not a drafter"):
        run_distillation(DistillConfig(**{**vars(config), "init": tiny_target}))

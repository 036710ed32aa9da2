"""Distillation picks bfloat16 only where the CPU has bf16 instructions; the feature card."""

import pytest
import torch

from cascade.distill.precision import cpu_has_bf16, resolve_dtype


def test_bf16_is_detected_from_the_cpu_flags(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("flags\t\t: fpu sse avx2 fma\n")
    assert not cpu_has_bf16(info)
    info.write_text("flags\t\t: fpu avx2 avx512f avx512_bf16\n")
    assert cpu_has_bf16(info)
    assert not cpu_has_bf16(tmp_path / "missing")


def test_explicit_choices_and_bad_names():
    assert resolve_dtype("float32") is torch.float32
    assert resolve_dtype("bfloat16") is torch.bfloat16
    assert resolve_dtype("auto") in (torch.float32, torch.bfloat16)
    with pytest.raises(ValueError, match="auto, float32 or bfloat16"):
        resolve_dtype("int8")


def test_the_feature_card_shows_the_held_out_curve(tmp_path):
    import json

    from cascade.distill.card import write_feature_card

    history = {"config": {"vocab_size": "16384"},
               "history": [{"elapsed_s": 60.0, "steps": 10, "loss": 5.0},
                           {"elapsed_s": 600.0, "steps": 90, "held_out_acceptance_k4": 0.125,
                            "mean_accepted_length": 1.5}]}
    (tmp_path / "distill_history.json").write_text(json.dumps(history))
    card = write_feature_card(tmp_path, None, "cascade distill --kind feature", "notes").read_text()
    assert "| 10 | 90 | 0.125 | 1.50 |" in card and "| vocab_size | 16384 |" in card

"""``--dtype auto``: bfloat16 only where the CPU lists bfloat16 instructions and a product
measures fast; the choice is made when the spec is made."""

import pytest

from cascade.core.model import dtypes
from cascade.core.model.runner import ModelSpec


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512_bf16\n\nflags\t: other\n")
    assert dtypes.cpu_flags(info) == {"fpu", "avx2", "avx512_bf16"}
    assert dtypes.cpu_flags(tmp_path / "missing") == set()


@pytest.mark.parametrize("flags, bf16_s, expected", [
    ({"avx2"}, 0.001, "float32"),            # no bfloat16 instructions: never measured
    ({"avx512_bf16"}, 0.001, "bfloat16"),    # listed and measured faster
    ({"amx_bf16"}, 0.013, "bfloat16"),       # within noise of float32: native
    ({"amx_bf16"}, 0.100, "float32"),        # listed but measured several times slower
])
def test_auto_picks_bfloat16_only_when_listed_and_measured_fast(monkeypatch, flags, bf16_s,
                                                                expected):
    import torch

    monkeypatch.setattr(dtypes, "cpu_flags", lambda: flags)
    monkeypatch.setattr(dtypes, "_product_s",
                        lambda operands: bf16_s if operands[0].dtype == torch.bfloat16 else 0.010)
    dtypes.cpu_runs_bf16_fast.cache_clear()
    try:
        assert dtypes.auto_dtype("cpu") == expected
        assert ModelSpec("folder", "auto").dtype == expected
    finally:
        dtypes.cpu_runs_bf16_fast.cache_clear()


def test_the_fastest_products_decide_so_a_busy_machine_picks_as_a_quiet_one(monkeypatch):
    """Most bfloat16 samples slowed down by other work (a median would say float32): the
    fastest of each dtype still says bfloat16."""
    import torch

    slow = iter([0.050, 0.003, 0.050, 0.050, 0.004, 0.050, 0.050, 0.050, 0.050])
    monkeypatch.setattr(dtypes, "cpu_flags", lambda: {"avx512_bf16"})
    monkeypatch.setattr(dtypes, "_product_s",
                        lambda operands: next(slow) if operands[0].dtype == torch.bfloat16 else 0.008)
    dtypes.cpu_runs_bf16_fast.cache_clear()
    try:
        assert dtypes.auto_dtype("cpu") == "bfloat16"
    finally:
        dtypes.cpu_runs_bf16_fast.cache_clear()


def test_an_unknown_dtype_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="auto"):
        ModelSpec("folder", "float8")

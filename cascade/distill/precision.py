"""Which precision distillation runs in: bfloat16 only where the CPU has bf16 instructions.

On an AVX2-only CPU a bfloat16 matmul runs about 7x slower than float32 (docs/benchmarks.md),
so ``auto`` picks float32 there and bfloat16 where /proc/cpuinfo lists avx512_bf16 or amx_bf16
(or on a CUDA device)."""

from __future__ import annotations

from pathlib import Path

import torch

from cascade.core.model.dtypes import BF16_FLAGS, cpu_flags


def cpu_has_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    return bool(cpu_flags(cpuinfo) & set(BF16_FLAGS))


def resolve_dtype(name: str) -> torch.dtype:
    """``float32``, ``bfloat16``, or ``auto`` (bfloat16 only where it is fast)."""
    if name == "auto":
        return torch.bfloat16 if torch.cuda.is_available() or cpu_has_bf16() else torch.float32
    if name not in ("float32", "bfloat16"):
        raise ValueError(f"dtype must be auto, float32 or bfloat16, got {name!r}")
    return getattr(torch, name)

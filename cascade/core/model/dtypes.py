"""``--dtype auto``: bfloat16 where the hardware runs it fast, float32 elsewhere.

A GPU that supports bfloat16 gets it. A CPU gets it only when its flags list ``amx_bf16`` or
``avx512_bf16`` *and* a quick measurement does not refute it (a bfloat16 product at most
``SLOWER_LIMIT`` times the float32 one; without those instructions bfloat16 runs several times
slower). The verifier's exactness reference is its own dtype: greedy output equals its own
one-token decoding in whichever dtype this picks.
"""

from __future__ import annotations

import logging
import time
from functools import cache
from pathlib import Path

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

BF16_FLAGS = ("amx_bf16", "avx512_bf16")


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The CPU's feature flags (empty when the system does not list them)."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


ROUNDS = 9
"""Timed products of each dtype, interleaved: the fastest of each is compared."""
SLOWER_LIMIT = 2.0
"""How much slower than float32 a bfloat16 product may measure and still count as native. On
unpacked weights (as measured here) native bfloat16 runs within ~15 % of float32 either way
(2-2.5x faster on the engine's packed weights); emulated bfloat16 runs several times slower.
A bare "no slower" test made the choice a coin toss on such machines: two verifiers of one
fleet could serve one session in different dtypes."""


def _operands(dtype: torch.dtype, rows: int = 16, width: int = 1024) -> tuple:
    """A product's operands in ``dtype``, its kernel warmed up once."""
    weight = torch.randn(width, width).to(dtype)
    x = torch.randn(rows, width).to(dtype)
    F.linear(x, weight)
    return x, weight


def _product_s(operands: tuple) -> float:
    """The time of one product of ``operands``."""
    started = time.perf_counter()
    F.linear(*operands)
    return time.perf_counter() - started


@cache
def cpu_runs_bf16_fast() -> bool:
    """Whether this CPU lists bfloat16 instructions and a bfloat16 product measures at most
    ``SLOWER_LIMIT`` times the float32 one. Each dtype's fastest of ``ROUNDS`` interleaved
    products is compared: other work on the machine (pods starting beside this one, a CPU
    quota's throttling) only ever adds time, so the fastest is the machine's own speed, and
    pods on one kind of machine pick the same dtype."""
    flags = cpu_flags() & set(BF16_FLAGS)
    if not flags:
        return False
    bf16_operands, f32_operands = _operands(torch.bfloat16), _operands(torch.float32)
    samples = [(_product_s(bf16_operands), _product_s(f32_operands)) for _ in range(ROUNDS)]
    bf16, f32 = min(b for b, _ in samples), min(f for _, f in samples)
    log.info("CPU flags %s: a bfloat16 product takes %.3f ms, float32 %.3f ms (fastest of %d)",
             sorted(flags), bf16 * 1e3, f32 * 1e3, ROUNDS)
    return bf16 <= SLOWER_LIMIT * f32


def auto_dtype(device: str) -> str:
    """The dtype ``--dtype auto`` stands for on ``device``."""
    if device.startswith("cuda"):
        # Emulated bfloat16 (T4-class cards report it supported) is slow: float16 there.
        native = torch.cuda.is_bf16_supported(including_emulation=False)
        return "bfloat16" if native else "float16"
    return "bfloat16" if device == "cpu" and cpu_runs_bf16_fast() else "float32"

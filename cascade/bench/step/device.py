"""Where ``cascade bench engine`` runs: the device's clock fence, its memory bandwidth and name
(on a CPU: the read bandwidth and the bfloat16/AMX flags), and models with random weights built
from a config directly on the device.

Random weights (``--random-weights``): ``cascade.core.model.weights``.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import TYPE_CHECKING
from functools import partial
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from cascade.core.model import dtypes
from cascade.core.model.runner import DTYPES, ModelRunner, ModelSpec
from cascade.core.model.weights import random_model

if TYPE_CHECKING:
    from cascade.bench.step.engine import EngineBenchConfig

COPY_BYTES = 4 << 30
"""The device bandwidth probe's tensor (the copy reads and writes this much)."""


def is_cuda(device: str | torch.device) -> bool:
    return torch.device(device).type == "cuda"


def synchronizer(device: str | torch.device) -> Callable[[], None]:
    """What to call before reading the clock: waits for the device's queued work (a no-op
    on the CPU, whose work is done when the call returns)."""
    if is_cuda(device):
        return partial(torch.cuda.synchronize, torch.device(device))
    return lambda: None


def device_name(device: str | torch.device) -> str | None:
    """The GPU's name (None on the CPU)."""
    return torch.cuda.get_device_name(torch.device(device)) if is_cuda(device) else None


def copy_bandwidth(device: str | torch.device, size_bytes: int = 0, tries: int = 5) -> float:
    """Bytes per second a device-to-device ``copy_`` moves, bytes read plus bytes written:
    the best of ``tries`` (after a warm-up) over a tensor of ``size_bytes`` (0: 4 GiB)."""
    sync = synchronizer(device)
    size_bytes = size_bytes or COPY_BYTES
    source = torch.ones(size_bytes // 2, dtype=torch.bfloat16, device=device)
    target = torch.empty_like(source)
    target.copy_(source)
    best = float("inf")
    for _ in range(tries):
        sync()
        started = time.perf_counter()
        target.copy_(source)
        sync()
        best = min(best, time.perf_counter() - started)
    moved = 2 * source.nbytes
    del source, target
    if is_cuda(device):
        torch.cuda.empty_cache()
    return moved / best


def cpu_flags() -> dict[str, bool]:
    """Whether the CPU has avx512_bf16 and AMX (``cascade.core.model.dtypes.cpu_flags``)."""
    flags = dtypes.cpu_flags()
    return {"avx512_bf16": "avx512_bf16" in flags,
            "amx": any(f.startswith("amx") for f in flags)}


def _largest_cache_bytes() -> int:
    sizes = [0]
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip()
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        sizes.append(int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text))
    return max(sizes)


def read_bandwidth(size_bytes: int = 0, tries: int = 5) -> float:
    """Bytes per second a sum reads from memory: the best of ``tries`` over a float32 tensor of
    ``size_bytes`` (0: four times the largest cache, at least 1 GiB)."""
    size_bytes = size_bytes or max(1 << 30, 4 * _largest_cache_bytes())
    data = torch.ones(size_bytes // 4, dtype=torch.float32)
    best = float("inf")
    for _ in range(tries):
        started = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - started)
    return data.nbytes / best


def memory_bandwidth(device: str, size_bytes: int = 0) -> float:
    """Bytes per second of the bandwidth limit: the host's read bandwidth on the CPU, the
    device-to-device copy's (read plus written) on a GPU; ``size_bytes`` 0: each one's default."""
    if is_cuda(device):
        return copy_bandwidth(device, size_bytes)
    return read_bandwidth(size_bytes)


def load_models(config: EngineBenchConfig, dtype: str) -> tuple[ModelRunner, object]:
    """The engine's runner and the plain transformers model of one dtype on ``config.device``.
    Random weights: one model serves both (on the CPU the runner packs its weights in place,
    so it takes a copy and the transformers column keeps the plain modules)."""
    if config.random_weights:
        model = random_model(config.target, DTYPES[dtype], config.device)
        on_cpu = model.device.type == "cpu"
        return ModelRunner(copy.deepcopy(model) if on_cpu else model), model
    runner = ModelRunner.load(ModelSpec(str(config.target), dtype=dtype, device=config.device))
    model = AutoModelForCausalLM.from_pretrained(config.target, dtype=DTYPES[dtype])
    return runner, model.to(config.device).eval()

"""How many tokens the verifier's KV store holds by default: what memory is left for it."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from cascade.core.kv.kv_store import KVShape

DEFAULT_MEMORY_FRACTION = 0.4
"""Share of the host memory available at start-up that the default budget may use (CPU)."""
DEFAULT_GPU_FRACTION = 0.8
"""Share of the GPU memory still free once the weights are loaded that the default budget may
use (the rest: activations and the allocator's slack)."""


def available_memory(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """Bytes this process can still use: the machine's available memory, or less when a
    container's memory limit (cgroup v2 or v1) leaves less."""
    available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    for limit_file, usage_file in (("memory.max", "memory.current"),
                                   ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        try:
            limit = (cgroup / limit_file).read_text().strip()
            usage = int((cgroup / usage_file).read_text())
        except (OSError, ValueError):
            continue
        if limit.isdigit():
            available = min(available, max(0, int(limit) - usage))
        break
    return available


def default_budget(shape: KVShape, max_length: int, device: torch.device | str = "cpu") -> int:
    """Tokens the store holds by default: 64 full-length sequences, at most
    ``DEFAULT_MEMORY_FRACTION`` of the host memory available now (container limits included),
    or on a GPU ``DEFAULT_GPU_FRACTION`` of its free memory, where the store lives."""
    device = torch.device(device)
    if device.type == "cuda":
        memory = int(torch.cuda.mem_get_info(device)[0] * DEFAULT_GPU_FRACTION)
    else:
        memory = int(available_memory() * DEFAULT_MEMORY_FRACTION)
    return max(max_length, min(64 * max_length, memory // shape.bytes_per_token))

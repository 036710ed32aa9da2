"""The machine a benchmark ran on, in one line (no imports beyond torch: the GPU benchmarks
import it without the services' dependencies)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch


def machine() -> str:
    """The CPU's model name, its core count and torch's version."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, torch {torch.__version__}"

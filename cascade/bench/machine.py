"""The machine a benchmark ran on, in one line (no imports beyond torch: the GPU benchmarks
import it without the services' dependencies), and how a benchmark's worker processes end with
it."""

from __future__ import annotations

import ctypes
import os
import platform
import signal
import sys
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


PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask the kernel to send this process SIGTERM when its parent dies, however the parent
    dies (killed included; Linux only, elsewhere nothing): a benchmark's worker processes
    (``initializer=``) then never outlive it."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)

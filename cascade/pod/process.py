"""The model thread and torch's thread count, shared by the drafter and verifier processes."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

from cascade.serving.process import setup_logging


def model_executor() -> ThreadPoolExecutor:
    """One thread runs every forward pass of a pod's model, in order, off the event loop.

    The thread applies the process's torch thread count to itself before its first op: a new
    thread's first BLAS call would otherwise start OpenMP with one thread per core, whatever
    ``torch.set_num_threads`` said (on a pod pinned to one core that ran 45x slower)."""
    threads = torch.get_num_threads()
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="model",
                              initializer=torch.set_num_threads, initargs=(threads,))


def setup_pod(num_threads: int, log_level: str = "INFO") -> None:
    """Logging, and torch's thread count when one is given (0 keeps torch's default)."""
    setup_logging(log_level)
    if num_threads > 0:
        torch.set_num_threads(num_threads)

"""Process entry helpers shared by the drafter and verifier: logging, threads, Redis, serving."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

import redis.asyncio as redis
import torch

from cascade.serving.registry import Heartbeat
from cascade.serving.server import GrpcService


def model_executor() -> ThreadPoolExecutor:
    """One thread runs every forward pass of a pod's model, in order, off the event loop.

    The thread applies the process's torch thread count to itself before its first op: a new
    thread's first BLAS call would otherwise start OpenMP with one thread per core, whatever
    ``torch.set_num_threads`` said (on a pod pinned to one core that ran 45x slower)."""
    threads = torch.get_num_threads()
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="model",
                              initializer=torch.set_num_threads, initargs=(threads,))


def setup_process(num_threads: int, log_level: str = "INFO") -> None:
    logging.basicConfig(level=log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if num_threads > 0:
        torch.set_num_threads(num_threads)


async def serve_forever(service: GrpcService, role: str, redis_url: str | None,
                        advertise: str | None, load) -> None:
    """Start ``service``, register it in Redis (when a URL is given), serve until a signal."""
    client = redis.from_url(redis_url) if redis_url else None
    port = await service.start()
    address = advertise or f"{service.host}:{port}"
    if client is not None:
        service.heartbeat = Heartbeat(client, role, address, load)
        await service.heartbeat.start()
    logging.getLogger(role).info("%s serving on %s", role, address)
    try:
        await service.run_until_signal()
    finally:
        if client is not None:
            await client.aclose()

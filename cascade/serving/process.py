"""Process entry helpers every service shares: logging, and serving until a signal (no torch)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import redis.asyncio as redis
import typer

from cascade.serving.registry import Heartbeat
from cascade.serving.server import GrpcService


def check_model(name: str | None, flag: str = "--model") -> None:
    """A model named by a path (``/`` or ``.`` first) must be a folder that is there: a usage
    error naming it, not transformers' complaint about hub repository names."""
    if name and name.startswith(("/", ".")) and not Path(name).is_dir():
        raise typer.BadParameter(f"no model folder at {name}", param_hint=flag)


def setup_logging(log_level: str = "INFO") -> None:
    logging.basicConfig(level=log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")


async def serve_forever(service: GrpcService, role: str, client: redis.Redis | None,
                        advertise: str | None, load: Callable[[], int],
                        facts: dict[str, str] | None = None) -> None:
    """Start ``service``, register it in the Redis of ``client`` (the pod's registry client,
    from ``cascade.serving.registry.connect``; closed at the end) with ``facts`` (e.g. its
    dtype) in its entry, serve until a signal."""
    port = await service.start(serving=False)
    address = advertise or f"{service.host}:{port}"
    if client is not None:  # registered (or trying to, if Redis is down) before it is ready
        service.heartbeat = Heartbeat(client, role, address, load, facts=facts)
        await service.heartbeat.start()
    await service.mark_serving()
    logging.getLogger(role).info("%s serving on %s", role, address)
    try:
        await service.run_until_signal()
    finally:
        if client is not None:
            await client.aclose()

"""What it costs per round to have each chunk on a Redis replica before the client gets it:
session appends (the gateway's per-round write) with the primary's acknowledgement alone, and
with ``WAIT 1`` (``--redis-wait-replicas 1``), side by side on a loopback primary with one
replica (and a sentinel, the services' client), interleaved in batches.

    cascade bench redis-durability [--appends 2000]
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

import numpy as np
from pydantic import BaseModel, Field
from rich.console import Console
from rich.table import Table

from cascade.protocol.request.mapping import GenerationRequest
from cascade.protocol.settings import SamplingParams
from cascade.serving.registry import connect
from cascade.serving.settings_cli import settings_command
from cascade.tools.redis_ha import RedisHA
from gateway.sessions.session_store import SessionStore

BATCH = 100


async def measure(url: str, appends: int) -> dict[int, list[float]]:
    """Seconds per append, by the number of replicas waited for (0 and 1)."""
    client = connect(url)
    stores = {n: SessionStore(client, wait_replicas=n) for n in (0, 1)}
    seconds: dict[int, list[float]] = {0: [], 1: []}
    try:
        record = await stores[0].create(GenerationRequest([1, 2, 3], SamplingParams()), "d", "v")
        length = 0
        for start in range(0, appends, BATCH):
            for n, store in stores.items():
                for _ in range(min(BATCH, appends - start)):
                    began = time.perf_counter()
                    await store.append(record.session_id, 1, length, [7, 8, 9, 10])
                    seconds[n].append(time.perf_counter() - began)
                    length += 4
    finally:
        await client.aclose()
    return seconds


class RedisDurabilitySettings(BaseModel):
    """What waiting for a Redis replica costs per session append: the primary's acknowledgement
    alone against WAIT 1, on a loopback primary with one replica."""

    appends: int = Field(2000, ge=1, description="Appends timed per durability (interleaved "
                         f"in batches of {BATCH}).")


def run(settings: RedisDurabilitySettings) -> None:
    """Start the loopback Redis, time the appends both ways and print the table."""
    with tempfile.TemporaryDirectory() as folder:
        ha = RedisHA(Path(folder), replicas=1, sentinels=1, password="bench").start()
        try:
            seconds = asyncio.run(measure(ha.url, settings.appends))
        finally:
            ha.stop()
    out = Table(title="Session append (one round of 4 tokens), loopback primary + 1 replica")
    for column in ("durability", "p50 ms", "p99 ms", "mean ms"):
        out.add_column(column, justify="right")
    for n, name in ((0, "primary acknowledged"), (1, "WAIT 1 (a replica has it)")):
        values = np.array(seconds[n]) * 1e3
        out.add_row(name, f"{np.percentile(values, 50):.3f}", f"{np.percentile(values, 99):.3f}",
                    f"{values.mean():.3f}")
    Console(width=120).print(out)


if __name__ == "__main__":
    settings_command(RedisDurabilitySettings, run)()

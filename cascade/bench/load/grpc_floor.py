"""The floor under Cascade's per-round protocol overhead: a bare gRPC bidi echo between two
processes pinned to different cores, 20-byte messages, no model and no Cascade code.

The server busy-waits ``compute`` ms before answering (the verifier's forward pass) while the
client waits (the drafter waiting for its verdict); the reported number is the round trip minus
that compute, i.e. what the transport alone costs per round.

    cascade bench grpc-floor [--rounds 40] [--compute-ms 0 --compute-ms 2 --compute-ms 35]
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
from pydantic import BaseModel, Field
from rich.console import Console
from rich.table import Table

from cascade.serving.settings_cli import settings_command
from cascade.tools.redis_server import free_port

SERVICE, METHOD = "floor.Echo", "/floor.Echo/Echo"


def _busy(message: bytes) -> bytes:
    started, seconds = time.perf_counter(), float(message.decode())
    while time.perf_counter() - started < seconds:
        pass
    return b"v" * 20


def _handlers(handler):
    return [grpc.method_handlers_generic_handler(
        SERVICE, {"Echo": grpc.stream_stream_rpc_method_handler(handler)})]


def serve_aio(port: int) -> None:
    async def echo(requests, context):
        async for message in requests:
            yield _busy(message)

    async def serve():
        server = grpc.aio.server()
        server.add_generic_rpc_handlers(_handlers(echo))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await server.wait_for_termination()

    asyncio.run(serve())


def serve_sync(port: int) -> None:
    def echo(requests, context):
        for message in requests:
            yield _busy(message)

    server = grpc.server(ThreadPoolExecutor(2))
    server.add_generic_rpc_handlers(_handlers(echo))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    server.wait_for_termination()


async def client_aio(port: int, computes: list[float], rounds: int) -> list[float]:
    medians = []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await channel.channel_ready()
        call = channel.stream_stream(METHOD)()
        for compute in computes:
            gaps = []
            for _ in range(rounds):
                started = time.perf_counter()
                await call.write(f"{compute / 1000:.4f}".encode())
                await call.read()
                gaps.append((time.perf_counter() - started) * 1e3 - compute)
            medians.append(statistics.median(gaps))
        await call.done_writing()
    return medians


def client_sync(port: int, computes: list[float], rounds: int) -> list[float]:
    import queue

    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    grpc.channel_ready_future(channel).result(timeout=10)
    outbox: queue.Queue = queue.Queue()
    replies = channel.stream_stream(METHOD)(iter(outbox.get, None))
    medians = []
    for compute in computes:
        gaps = []
        for _ in range(rounds):
            started = time.perf_counter()
            outbox.put(f"{compute / 1000:.4f}".encode())
            next(replies)
            gaps.append((time.perf_counter() - started) * 1e3 - compute)
        medians.append(statistics.median(gaps))
    outbox.put(None)
    channel.close()
    return medians


def _server(kind: str, port: int, core: int) -> None:
    os.sched_setaffinity(0, {core})
    (serve_aio if kind == "aio" else serve_sync)(port)


def measure(server_kind: str, client_kind: str, computes: list[float], rounds: int) -> list[float]:
    """Server on the first core (a spawned process), client here on the last core."""
    cores = sorted(os.sched_getaffinity(0))
    port = free_port()
    server = multiprocessing.get_context("spawn").Process(
        target=_server, args=(server_kind, port, cores[0]), daemon=True)
    server.start()
    try:
        os.sched_setaffinity(0, {cores[-1]})
        if client_kind == "aio":
            return asyncio.run(client_aio(port, computes, rounds))
        return client_sync(port, computes, rounds)
    finally:
        server.kill()
        server.join()
        os.sched_setaffinity(0, cores)


class GrpcFloorSettings(BaseModel):
    """The transport floor under the per-round overhead: a bare gRPC bidi echo between two
    pinned processes, round trip minus the server's compute (asyncio and sync stacks)."""

    rounds: int = Field(40, ge=1, description="Round trips per compute time (the median is "
                        "reported).")
    compute_ms: list[float] = Field([0.0, 2.0, 35.0, 75.0], description="Milliseconds the "
                                    "server busy-waits before answering (repeat the flag).")


def run(settings: GrpcFloorSettings) -> None:
    """Measure both stacks at every compute time and print the table."""
    table = Table(title="gRPC bidi echo: round trip minus server compute, ms (median)")
    table.add_column("server / client")
    for compute in settings.compute_ms:
        table.add_column(f"compute {compute:g} ms", justify="right")
    for server_kind, client_kind in (("aio", "aio"), ("sync", "sync")):
        medians = measure(server_kind, client_kind, settings.compute_ms, settings.rounds)
        table.add_row(f"{server_kind} / {client_kind}", *(f"{m:.2f}" for m in medians))
    Console().print(table)


if __name__ == "__main__":
    settings_command(GrpcFloorSettings, run)()

"""A stuck model thread turns the pod's health off and takes it out of the registry; when the
thread answers again, both come back (a real gRPC server, health client and Redis)."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cascade.serving.registry import Heartbeat, live_pods
from cascade.serving.server import GrpcService
from cascade.serving.watchdog import ExecutorWatchdog

SERVING, NOT_SERVING = (health_pb2.HealthCheckResponse.SERVING,
                        health_pb2.HealthCheckResponse.NOT_SERVING)


async def wait_for_status(stub, status: int, timeout_s: float = 5.0) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
        if reply.status == status:
            return time.monotonic() - started
        await asyncio.sleep(0.05)
    raise AssertionError(f"health never became {status}")


async def test_a_stuck_model_thread_turns_health_off_until_it_answers(redis_client):
    executor = ThreadPoolExecutor(max_workers=1)
    service = GrpcService([], watchdog=ExecutorWatchdog(executor, stall_s=0.3, interval_s=0.05))
    await service.start()
    service.heartbeat = Heartbeat(redis_client, "verifier", service.address, lambda: 0)
    await service.heartbeat.start()
    release = threading.Event()
    try:
        async with grpc.aio.insecure_channel(service.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            await wait_for_status(stub, SERVING)
            executor.submit(release.wait, 30)  # a forward pass that never returns
            assert await wait_for_status(stub, NOT_SERVING) < 2.0
            assert service.watchdog.is_stalled
            assert not await live_pods(redis_client, "verifier")
            release.set()
            await wait_for_status(stub, SERVING)
            assert [p.address for p in await live_pods(redis_client, "verifier")] == [
                service.address]
    finally:
        release.set()
        await service.drain()
        executor.shutdown()

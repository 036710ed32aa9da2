"""Clients ping idle connections; the servers' ping policy must allow it, or they answer with
a GOAWAY ``too_many_pings`` that breaks every stream on the connection."""

import asyncio

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from cascade.serving.server import KEEPALIVE_OPTIONS, MIN_PING_INTERVAL, server_options

PING_MS = 300
"""Faster than production (20 s) so the test is short; the server allows half of it."""


async def test_an_idle_stream_outlives_the_clients_pings():
    options = [(name, PING_MS // 2 if name == MIN_PING_INTERVAL else value)
               for name, value in server_options()]
    server = grpc.aio.server(options=options)
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    pings = [(name, PING_MS if name == "grpc.keepalive_time_ms" else value)
             for name, value in KEEPALIVE_OPTIONS]
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=pings) as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest())  # connected; then idle, pinging
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            await asyncio.sleep(13 * PING_MS / 1000)  # ~13 pings without data
            # A GOAWAY would have closed the connection: the channel would be idle again.
            assert channel.get_state() == grpc.ChannelConnectivity.READY
    finally:
        await server.stop(0)

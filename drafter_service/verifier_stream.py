"""One session's Verify call as its drafter sees it: requests written through the link's
injected delay (``cascade.serving.mesh.delay``), verdicts read after it."""

from __future__ import annotations

import asyncio

import grpc

from cascade.serving.mesh.delay import DelayedWriter, SessionDelay
from cascade.v1 import verifier_pb2, verifier_pb2_grpc


class VerifierStream:
    def __init__(self, channel: grpc.aio.Channel, timeout: float | None,
                 link: SessionDelay) -> None:
        self.call = verifier_pb2_grpc.VerifierStub(channel).Verify(timeout=timeout)
        self.link = link
        self.writer = DelayedWriter(self._write, link)

    async def send(self, message: verifier_pb2.VerifyRequest) -> None:
        """Send ``message`` after its delay (returns without waiting for that)."""
        await self.writer.send(message)

    async def receive(self) -> verifier_pb2.Verdict:
        """The next verdict, once its trip back is over (a stale one too: the session decides)."""
        verdict = await self.call.read()
        if verdict is grpc.aio.EOF:
            raise ConnectionError("verifier closed the stream")
        await self.link.wait()
        return verdict

    async def finish(self) -> None:
        """Every request sent, then the writing side closed."""
        await self.writer.flush()
        await self.call.done_writing()

    def close(self) -> None:
        self.writer.close()
        self.call.cancel()

    async def _write(self, message: verifier_pb2.VerifyRequest) -> None:
        """Write to the verifier; if it has already ended the stream, raise its status (such
        as RESOURCE_EXHAUSTED when it had no memory for the session), not a write error."""
        try:
            await self.call.write(message)
        except asyncio.InvalidStateError:
            call = self.call
            raise grpc.aio.AioRpcError(
                await call.code(), grpc.aio.Metadata(), await call.trailing_metadata(),
                details=await call.details()) from None

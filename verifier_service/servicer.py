"""Thin gRPC servicer over VerifierSessions: protobuf in, core call, protobuf out."""

from __future__ import annotations

from cascade.serving.errors import StaleEpoch
from cascade.v1 import verifier_pb2, verifier_pb2_grpc
from verifier_service.sessions import VerifierSessions


class VerifierServicer(verifier_pb2_grpc.VerifierServicer):
    def __init__(self, sessions: VerifierSessions) -> None:
        self.sessions = sessions

    async def Verify(self, request_iterator, context):
        entry = None
        try:
            async for request in request_iterator:
                if request.HasField("open"):
                    entry = self.sessions.open(request.open)
                elif entry is None:
                    raise ValueError("send a SessionOpen message before draft blocks")
                else:
                    yield await self.sessions.verify(entry, request.block)
        finally:
            if entry is not None:
                self.sessions.close(entry)

    async def Decode(self, request, context):
        """Target-only generation: rounds with no drafted tokens until the session finishes."""
        entry = self.sessions.open(request.session)
        try:
            round_number = 0
            while not entry.session.is_finished:
                block = verifier_pb2.DraftBlock(
                    session_id=entry.session_id, epoch=entry.epoch, round=round_number,
                    base_len=len(entry.session.committed))
                verdict = await self.sessions.verify(entry, block)
                if verdict.is_stale:
                    raise StaleEpoch(f"session {entry.session_id} was taken over by a newer epoch")
                yield verdict.result
                round_number += 1
        finally:
            self.sessions.close(entry)


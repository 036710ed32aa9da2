"""Thin gRPC servicer over the SessionTable: protobuf in, core call, protobuf out."""

from __future__ import annotations

from cascade.pod.messages import round_from_verdict
from cascade.serving.errors import StaleEpoch
from cascade.serving.mesh import OPEN, MeshSecurity
from cascade.v1 import common_pb2, verifier_pb2, verifier_pb2_grpc
from verifier_service.sessions import SessionTable


class VerifierServicer(verifier_pb2_grpc.VerifierServicer):
    def __init__(self, sessions: SessionTable, mesh: MeshSecurity = OPEN) -> None:
        self.sessions, self.mesh = sessions, mesh

    async def _open(self, msg: verifier_pb2.SessionOpen):
        """Only a session a gateway tagged (with a session key set), then the table's open."""
        self.mesh.check_owner_tag(msg.session_id, msg.epoch, msg.owner_tag)
        return await self.sessions.open(msg)

    async def Verify(self, request_iterator, context):
        session = None
        try:
            async for request in request_iterator:
                if request.HasField("open"):
                    session = await self._open(request.open)
                    if session.sequence.feature_layers:
                        for reply in await self.sessions.open_replies(session):
                            yield reply
                    if request.open.plan_drafts:  # how long the first block should be
                        plan = self.sessions.plan_reply(session)
                        yield plan
                        async for alone in self._decode_alone(session, plan, first_round=0):
                            yield alone
                elif session is None:
                    raise ValueError("open: send a SessionOpen message before draft blocks")
                elif (verdict := await self.sessions.verify(session, request.block)) is not None:
                    yield verdict  # None: a block sent ahead on a wrong guess, dropped
                    async for alone in self._decode_alone(session, verdict):
                        yield alone
        finally:
            if session is not None:
                await self.sessions.close(session)

    async def _decode_alone(self, session, verdict, first_round: int | None = None):
        """While the plan says the session's drafts do not pay (a verdict asking for 0 drafted
        tokens), the verifier decodes it alone, round after round, as Decode does; the drafter
        sends nothing and relays these verdicts until one asks for drafts again.
        ``first_round``: the round to start at (default: the one after ``verdict``'s)."""
        next_round = verdict.round + 1 if first_round is None else first_round
        while (verdict.HasField("next_draft_tokens") and verdict.next_draft_tokens == 0
               and verdict.finish_reason == common_pb2.FINISH_REASON_UNSPECIFIED):
            verdict = await self.sessions.verify(session, verifier_pb2.DraftBlock(
                session_id=session.session_id, epoch=session.epoch, round=next_round,
                base_len=len(session.sequence.committed)))
            next_round = verdict.round + 1
            yield verdict
            if verdict.is_stale:
                return

    async def Decode(self, request, context):
        """Target-only generation: rounds with no drafted tokens until the session finishes."""
        session = await self._open(request.session)
        try:
            round_number = 0
            while not session.sequence.is_finished:
                block = verifier_pb2.DraftBlock(
                    session_id=session.session_id, epoch=session.epoch, round=round_number,
                    base_len=len(session.sequence.committed))
                verdict = await self.sessions.verify(session, block)
                if verdict.is_stale:
                    raise StaleEpoch(f"session {session.session_id} was taken over by a newer "
                                     "epoch")
                yield round_from_verdict(verdict, drafted=(), draft_us=0, round_us=0)
                round_number += 1
        finally:
            await self.sessions.close(session)

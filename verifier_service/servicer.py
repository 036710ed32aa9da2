"""Thin gRPC servicer over the SessionTable: a Verify stream per session, pumped through
``cascade.session.VerifierSession``; Decode for target-only generation."""

from __future__ import annotations

from cascade.pod.messages import round_from_verdict
from cascade.session import actions as act
from cascade.session.verifier import VerifierSession
from cascade.serving.errors import StaleEpoch
from cascade.serving.mesh import OPEN, MeshSecurity
from cascade.v1 import verifier_pb2, verifier_pb2_grpc
from verifier_service.pump import Inbox, VerifyPump
from verifier_service.sessions import SessionTable


class VerifierServicer(verifier_pb2_grpc.VerifierServicer):
    def __init__(self, sessions: SessionTable, mesh: MeshSecurity = OPEN) -> None:
        self.sessions, self.mesh = sessions, mesh

    async def _open(self, msg: verifier_pb2.SessionOpen):
        """Only a session a gateway tagged (with a session key set), then the table's open."""
        self.mesh.check_owner_tag(msg.session_id, msg.epoch, msg.owner_tag)
        return await self.sessions.open(msg)

    async def Verify(self, request_iterator, context):
        """The pump around ``cascade.session.VerifierSession``: requests read (shadows and
        ready notes beside the rest, ``Inbox``), the machine's actions performed, replies
        yielded, until the drafter closes its side."""
        pump = VerifyPump(self.sessions, self._open, VerifierSession())
        inbox = Inbox(request_iterator, pump.aside)
        try:
            actions = pump.machine.start()
            while actions:
                answers = []
                for action in actions:
                    if isinstance(action, act.Reply):
                        yield action.msg
                    elif isinstance(action, act.ReplyFeatures):
                        for reply in await self.sessions.open_replies(pump.session):
                            yield reply
                    elif (answer := await pump.perform(action, inbox)) is not None:
                        answers.append(answer)
                actions = [then for answer in answers for then in pump.machine.on(answer)]
        finally:
            inbox.close()
            if pump.session is not None:
                await self.sessions.close(pump.session)

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
